"""How many compute threads a training process uses on a machine it may share.

An OpenMP thread that finds its core busy stalls every parallel region it belongs to: with two
other processes on this project's 2-core machine, the LFW preset's step took about 5 s with two
threads and about 0.5 s with one (0.25 s with two threads on the quiet machine).
``train.num_threads: auto`` therefore takes only the cores that are free now::

    threads = max(1, min(cap, cores // local_ranks − round(load) − data_workers))

``cores``: the CPUs this process may run on (``os.sched_getaffinity``); ``load``: the 1-minute
load average (``os.getloadavg``: processes running or waiting to run); ``data_workers``:
``data.num_workers`` (each worker keeps one core busy); ``local_ranks``: processes started on
this machine (``LOCAL_WORLD_SIZE`` under torchrun); ``cap``: ``OMP_NUM_THREADS`` when set. The
count is decided once per process, so every trainer in it computes the same way.

When the load exceeds the cores the machine is oversubscribed and training will be slower than
measured on a quiet one: :func:`oversubscription_warning` says so. Spinning OpenMP threads make
that worse, so the ``partialfc train`` command asks for ``OMP_WAIT_POLICY=PASSIVE`` (idle
threads sleep instead of spinning) unless the environment sets a policy itself.
"""

from __future__ import annotations

import os

_AUTO: int | None = None  # the count "auto" chose in this process


def auto_threads(
    cores: int,
    load: float,
    data_workers: int = 0,
    local_ranks: int = 1,
    cap: int | None = None,
) -> int:
    """The number of threads ``auto`` takes (see the module docstring); always ≥ 1."""
    if cores < 1 or local_ranks < 1 or data_workers < 0 or load < 0:
        raise ValueError(
            f"need cores >= 1, local_ranks >= 1, data_workers >= 0 and load >= 0, got "
            f"cores={cores}, local_ranks={local_ranks}, data_workers={data_workers}, load={load}"
        )
    free = cores // local_ranks - round(load) - data_workers
    if cap is not None:
        free = min(free, cap)
    return max(1, free)


def oversubscription_warning(cores: int, load: float) -> str | None:
    """A one-line warning when ``load`` exceeds ``cores``, else None."""
    if load <= cores:
        return None
    return (
        f"warning: load average {load:.1f} on {cores} cores: the machine is oversubscribed and "
        "training will run slower than on a quiet one"
    )


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not available on this platform
        return 0.0


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def resolve_num_threads(setting: int | str, data_workers: int) -> int:
    """``train.num_threads`` as a count: ``auto`` (decided once per process), N, or 0 (torch's
    default, returned as 0)."""
    global _AUTO
    if setting != "auto":
        return int(setting)
    if _AUTO is None:
        _AUTO = auto_threads(
            available_cores(),
            load_average(),
            data_workers,
            local_ranks=_env_int("LOCAL_WORLD_SIZE") or 1,
            cap=_env_int("OMP_NUM_THREADS"),
        )
    return _AUTO


def apply_num_threads(setting: int | str, data_workers: int) -> int:
    """Set torch's intra-op threads from ``train.num_threads``; return the count in use."""
    import torch

    threads = resolve_num_threads(setting, data_workers)
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def passive_wait_environment(environ: dict) -> dict:
    """The variables to add before OpenMP starts: a passive wait policy unless one is set."""
    return {} if "OMP_WAIT_POLICY" in environ else {"OMP_WAIT_POLICY": "PASSIVE"}
