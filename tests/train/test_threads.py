"""``train.num_threads: auto``: the free cores, as a pure function of cores, load, data workers,
local ranks and an ``OMP_NUM_THREADS`` cap; the oversubscription warning; the config value."""

from __future__ import annotations

import pytest

from partialfc.train import threads
from partialfc.train.config import load_config
from partialfc.train.threads import auto_threads, oversubscription_warning


@pytest.mark.parametrize(
    ("cores", "load", "workers", "ranks", "cap", "expected"),
    [
        (2, 0.0, 1, 1, None, 1),  # the main job on a quiet 2-core machine: 1 + 1 worker
        (2, 0.0, 0, 1, None, 2),
        (2, 2.3, 0, 1, None, 1),  # two busy processes: one thread, never zero
        (2, 8.0, 1, 1, None, 1),
        (16, 0.4, 2, 1, None, 14),
        (16, 3.6, 2, 1, None, 10),  # round(3.6) = 4 cores busy
        (16, 0.0, 0, 4, None, 4),  # torchrun with 4 ranks on this machine: a quarter each
        (16, 0.0, 0, 1, 3, 3),  # OMP_NUM_THREADS=3 caps it
    ],
)
def test_auto_takes_the_free_cores(cores, load, workers, ranks, cap, expected):
    assert auto_threads(cores, load, workers, local_ranks=ranks, cap=cap) == expected


def test_auto_rejects_impossible_inputs():
    with pytest.raises(ValueError, match="cores >= 1"):
        auto_threads(0, 0.0)


def test_warning_only_when_load_exceeds_cores():
    assert oversubscription_warning(2, 2.0) is None
    assert oversubscription_warning(2, 8.26) == (
        "warning: load average 8.3 on 2 cores: the machine is oversubscribed and training will "
        "run slower than on a quiet one"
    )


def test_auto_is_decided_once_per_process(monkeypatch):
    monkeypatch.setattr(threads, "_AUTO", None)
    monkeypatch.setattr(threads, "available_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(threads, "load_average", lambda: 1.0)
    assert threads.resolve_num_threads("auto", 1) == 6
    monkeypatch.setattr(threads, "load_average", lambda: 5.0)
    assert threads.resolve_num_threads("auto", 1) == 6  # unchanged within the process
    assert threads.resolve_num_threads(3, 1) == 3 and threads.resolve_num_threads(0, 1) == 0


def test_config_accepts_auto_and_counts():
    assert load_config(None, ["data.source=omniglot"]).train.num_threads == "auto"
    assert load_config(None, ["data.source=omniglot", "train.num_threads=2"]).train.num_threads == 2
