"""Training checkpoints: atomic directories, the last K kept, loaded without unpickling.

A checkpoint is a directory ``<run>/checkpoints/step-00001234/`` holding

* ``backbone.safetensors``  backbone weights (what deployment needs), with
  ``model.json``            ``{"name": ..., "kwargs": {...}}`` to rebuild the backbone
                            (both written and read by :mod:`partialfc.backbone.io`);
* ``head/``                 the head's state and its optimizer's (``Head.save_state``;
                            Partial FC: reshardable center shards);
* ``trainer.pt``            backbone optimizer, LR step, grad scaler, sampler position, progress
                            (tensors and plain containers only: read with ``weights_only=True``);
* ``rng-rank<r>.pt``        each rank's RNG states (python, numpy, torch, cuda);
* ``meta.json``             step, epoch, world size, the resolved config.

The directory is written under a temporary name and renamed into place, so a crash never leaves
a half-written checkpoint under a real name. Likewise a checkpoint is deleted (pruned or
replaced) by first renaming it to a hidden trash name in the same folder: a crash in the
middle of the deletion leaves only trash, which :func:`remove_leftovers` clears when training
starts and which is never listed or loaded as a checkpoint.
"""

from __future__ import annotations

import random
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from partialfc.atomic import atomic_output, atomic_write_bytes  # noqa: F401 - re-exported
from partialfc.backbone.io import (  # noqa: F401 - the backbone's files; re-exported
    CHECKPOINT_PATTERN,
    MODEL_CONFIG_FILENAME,
    WEIGHTS_FILENAME,
    list_checkpoints,
    load_backbone_from_checkpoint,
    load_backbone_state,
    newest_checkpoint,
    read_model_config,
    save_backbone,
)

TRASH_PREFIX = ".trash-"
# what a crash can leave in a checkpoint folder: trash, and unfinished ``.step-N.tmp`` staging
_LEFTOVER_PATTERN = re.compile(r"^(\.trash-.*|\.step-\d{8}\.tmp)$")


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file + rename (:mod:`partialfc.atomic`)."""
    with atomic_output(path) as tmp:
        torch.save(obj, tmp)


def safe_torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)`` with an error that names the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file missing: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - re-raised with the file name
        raise ValueError(f"cannot read checkpoint file {path}: {err}") from err


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def discard_directory(path: Path) -> None:
    """Delete ``path`` by renaming it to a hidden trash name in the same folder first, so that
    an interrupted deletion never leaves a half-deleted checkpoint under its real name."""
    path = Path(path)
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}.{secrets.token_hex(4)}")
    path.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def remove_leftovers(checkpoint_dir: Path) -> list[str]:
    """Delete the trash and unfinished staging directories an interrupted run left in
    ``checkpoint_dir``; returns their names."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    found = sorted(p for p in checkpoint_dir.iterdir() if _LEFTOVER_PATTERN.match(p.name))
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return [p.name for p in found]


def prune_checkpoints(checkpoint_dir: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (through :func:`discard_directory`)."""
    for old in list_checkpoints(checkpoint_dir)[:-keep_last]:
        discard_directory(old)


# ---------------------------------------------------------------------- RNG states


def capture_rng_state() -> dict:
    """RNG states as tensors / plain values (loadable with ``weights_only=True``)."""
    py_version, py_state, py_gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [
            np_kind,
            torch.from_numpy(np_keys.astype(np.int64)),
            np_pos,
            np_has_gauss,
            np_gauss,
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state(
        (np_kind, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss)
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def resolve_checkpoint(spec: str, run_dir: Path) -> Path | None:
    """``"auto"`` → newest checkpoint of this run (or None); otherwise the given directory."""
    if spec == "auto":
        found = list_checkpoints(run_dir / "checkpoints")
        return found[-1] if found else None
    path = newest_checkpoint(spec, marker="meta.json")
    if path is None:
        raise FileNotFoundError(
            f"checkpoint.resume={spec!r}: no training checkpoint there (meta.json); to start "
            "from the weights of a model directory use checkpoint.init_from"
        )
    return path


def resolve_init_from(spec: str) -> tuple[Path, dict]:
    """The weights ``checkpoint.init_from`` names: ``(directory holding backbone.safetensors,
    model_config)``.

    ``spec`` is a model directory (``backbone.safetensors`` + ``model.json``, as
    ``partialfc import-weights`` writes; or ``+ preprocessing.json``, as ``partialfc export``
    writes), a training checkpoint, or a run folder (its newest checkpoint). No trainer state
    is needed. Errors name ``checkpoint.init_from``.
    """
    from partialfc.backbone.spec import SPEC_FILENAME, PreprocessingSpec

    key = f"checkpoint.init_from={spec!r}"
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"{key}: no such directory")
    found = newest_checkpoint(path)
    if found is not None:
        try:
            model_config = read_model_config(found)
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None
    elif (path / SPEC_FILENAME).is_file():
        found, spec_file = path, PreprocessingSpec.load(path / SPEC_FILENAME)
        model_config = {"name": spec_file.model_name, "kwargs": dict(spec_file.model_kwargs)}
    else:
        raise FileNotFoundError(
            f"{key}: no model there: expected a model directory ({WEIGHTS_FILENAME} + "
            f"{MODEL_CONFIG_FILENAME} or {SPEC_FILENAME}), a training checkpoint or a run folder"
        )
    if not (found / WEIGHTS_FILENAME).is_file():
        raise FileNotFoundError(f"{key}: {found} has no {WEIGHTS_FILENAME}")
    return found, model_config
