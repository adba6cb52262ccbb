"""Sharded, reshardable checkpoints of a :class:`PartialFC` table and its row-sparse optimizer.

Layout of a checkpoint directory::

    manifest.json                      num_classes, embedding_dim, num_subcenters, shards, ...
    shard-00000-of-00002.safetensors   rank 0's centers [+ optimizer state], its class range
    shard-00001-of-00002.safetensors

Saving (a collective: every rank calls it): each rank writes its shard into
``<dir>.partial/``, all ranks agree that every write succeeded, rank 0 writes the manifest
(last) and swaps the finished directory into place with ``os.replace``; a reader never sees a
half-written checkpoint under ``<dir>``.

Loading works on any number of ranks: each rank reads the rows of its own class block from
whichever old shards overlap it (safetensors slices, no full-table copy). Every rank checks the
manifest itself (C, d, K, optimizer type) and the ranks then all-reduce a success flag, so a bad
checkpoint raises a ``ValueError`` naming the file on every rank instead of hanging one of them.
No pickle is involved (safetensors + JSON).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from partialfc.atomic import atomic_output, atomic_write_bytes
from partialfc.classifier.collectives import all_gather_rows_no_grad, all_reduce_flag_all, barrier
from partialfc.classifier.optim import RowSparseOptimizer
from partialfc.classifier.shard import ShardedCenters

__all__ = ["save_partial_fc_checkpoint", "load_partial_fc_checkpoint", "gather_full_centers"]

FORMAT = "partialfc.classifier/1"
MANIFEST = "manifest.json"


def _shard_name(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.safetensors"


def _local_table(pfc: ShardedCenters) -> Tensor:
    return pfc.weight.detach() if pfc.update == "dense" else pfc.centers.data


def _check_optimizer(optimizer, pfc: ShardedCenters) -> None:
    if optimizer is None:
        return
    if not isinstance(optimizer, RowSparseOptimizer) or optimizer.partial_fc is not pfc:
        raise ValueError("optimizer must be a RowSparseSGD/RowSparseAdamW of this PartialFC")


def _agree(error: BaseException | None, pfc: ShardedCenters, what: str) -> None:
    """Raise on every rank if ``error`` happened on any rank."""
    ok = all_reduce_flag_all(error is None, pfc.process_group, pfc.device)
    if error is not None:
        raise error
    if not ok:
        raise ValueError(f"{what} failed on another rank (see that rank's error)")


def save_partial_fc_checkpoint(directory, partial_fc: ShardedCenters, optimizer=None) -> Path:
    """Write this rank's shard (and, on rank 0, the manifest). Collective: call on all ranks."""
    pfc = partial_fc
    _check_optimizer(optimizer, pfc)
    final = Path(directory)
    staging = final.with_name(final.name + ".partial")
    error: BaseException | None = None
    if pfc.rank == 0:
        try:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        except OSError as exc:
            error = OSError(f"cannot create checkpoint directory {staging}: {exc}")
    _agree(error, pfc, "creating the checkpoint directory")

    try:
        tensors = {"centers": _local_table(pfc).contiguous()}
        if optimizer is not None:
            for name, table in optimizer.tables.items():
                tensors[f"optimizer.{name}"] = table.data
            if hasattr(optimizer, "row_steps"):
                tensors["optimizer.row_steps"] = optimizer.row_steps
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        meta = {"class_start": str(pfc.block.start), "class_stop": str(pfc.block.stop)}
        name = _shard_name(pfc.rank, pfc.world_size)
        with atomic_output(staging / name) as tmp:
            save_file(tensors, str(tmp), metadata=meta)
    except Exception as exc:  # noqa: BLE001 - re-raised after all ranks agree
        error = exc
    _agree(error, pfc, "writing a checkpoint shard")

    if pfc.rank == 0:
        try:
            from partialfc.classifier.sharding import class_blocks

            manifest = {
                "format": FORMAT,
                "num_classes": pfc.num_classes,
                "embedding_dim": pfc.embedding_dim,
                "num_subcenters": pfc.num_subcenters,
                "storage_dtype": str(pfc.storage_dtype).removeprefix("torch."),
                "sampling_step": pfc.sampling_step,
                "seed": pfc.seed,
                "world_size": pfc.world_size,
                "shards": [
                    {
                        "file": _shard_name(r, pfc.world_size),
                        "class_start": b.start,
                        "class_stop": b.stop,
                    }
                    for r, b in enumerate(class_blocks(pfc.num_classes, pfc.world_size))
                ],  # fmt: skip
                "optimizer": None
                if optimizer is None
                else {
                    "type": type(optimizer).__name__,
                    "param_groups": [optimizer._hyperparameters()],
                    "num_steps": optimizer.num_steps,
                    "state": sorted(optimizer.tables)
                    + (["row_steps"] if hasattr(optimizer, "row_steps") else []),
                },
            }
            atomic_write_bytes(staging / MANIFEST, json.dumps(manifest, indent=1).encode())
            old = final.with_name(final.name + ".old")
            if final.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        except Exception as exc:  # noqa: BLE001
            error = exc
    _agree(error, pfc, "finishing the checkpoint")
    barrier(pfc.process_group)
    return final


def _read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise ValueError(f"{path}: not found (not a Partial FC checkpoint, or an unfinished one)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def _load_local(directory: Path, pfc: ShardedCenters, optimizer) -> dict:
    manifest = _read_manifest(directory)
    where = directory / MANIFEST
    for key, mine in (
        ("num_classes", pfc.num_classes),
        ("embedding_dim", pfc.embedding_dim),
        ("num_subcenters", pfc.num_subcenters),
    ):
        if manifest.get(key) != mine:
            raise ValueError(f"{where}: {key}={manifest.get(key)} but this PartialFC has {mine}")
    saved_opt = manifest.get("optimizer")
    if optimizer is not None:
        if saved_opt is None:
            raise ValueError(f"{where}: holds no optimizer state")
        if saved_opt["type"] != type(optimizer).__name__:
            raise ValueError(
                f"{where}: optimizer {saved_opt['type']}, not {type(optimizer).__name__}"
            )
        missing = set(optimizer.tables) - set(saved_opt["state"])
        if missing:
            raise ValueError(f"{where}: optimizer state lacks {sorted(missing)}")

    k = pfc.num_subcenters
    start, stop = pfc.block.start, pfc.block.stop
    table = _local_table(pfc)
    covered = 0
    for shard in manifest["shards"]:
        lo, hi = max(start, shard["class_start"]), min(stop, shard["class_stop"])
        if lo >= hi:
            continue
        path = directory / shard["file"]
        if not path.is_file():
            raise ValueError(f"{path}: shard listed in the manifest is missing")
        src = slice((lo - shard["class_start"]) * k, (hi - shard["class_start"]) * k)
        dst = slice((lo - start) * k, (hi - start) * k)
        with safe_open(str(path), framework="pt") as f:
            rows = f.get_slice("centers")[src]
            if tuple(rows.shape[1:]) != (pfc.embedding_dim,):
                raise ValueError(f"{path}: centers have width {rows.shape[1]}")
            with torch.no_grad():
                table[dst].copy_(rows)
            if optimizer is not None:
                for name in optimizer.tables:
                    optimizer.load_rows(name, dst.start, f.get_slice(f"optimizer.{name}")[src])
                if hasattr(optimizer, "row_steps"):
                    steps = f.get_slice("optimizer.row_steps")[src]
                    optimizer.row_steps[dst].copy_(steps)
        covered += hi - lo
    if covered != stop - start:
        raise ValueError(f"{where}: shards cover {covered} of this rank's {stop - start} classes")
    return manifest


def load_partial_fc_checkpoint(directory, partial_fc: ShardedCenters, optimizer=None) -> dict:
    """Load a checkpoint written on any number of ranks into this rank's block.

    Restores the centers, the sampling step and (when ``optimizer`` is given) its per-row state,
    hyper-parameters and step count. Collective: call on all ranks. Returns the manifest.
    """
    pfc = partial_fc
    _check_optimizer(optimizer, pfc)
    error: BaseException | None = None
    manifest: dict = {}
    try:
        manifest = _load_local(Path(directory), pfc, optimizer)
    except Exception as exc:  # noqa: BLE001 - re-raised on every rank by _agree
        error = exc
    _agree(error, pfc, f"loading checkpoint {directory}")
    pfc.sampling_step = int(manifest["sampling_step"])
    if optimizer is not None:
        saved = manifest["optimizer"]
        hyper = dict(saved["param_groups"][0])
        if "betas" in hyper:
            hyper["betas"] = tuple(hyper["betas"])
        optimizer.load_hyperparameters(hyper, saved["num_steps"])
    return manifest


def gather_full_centers(partial_fc: ShardedCenters) -> Tensor:
    """The whole ``(C * K, d)`` table as float32 on every rank (small tables: tests, export)."""
    pfc = partial_fc
    from partialfc.classifier.sharding import class_blocks

    sizes = [b.size * pfc.num_subcenters for b in class_blocks(pfc.num_classes, pfc.world_size)]
    local = _local_table(pfc).float().to(pfc.device)
    return all_gather_rows_no_grad(local, sizes, pfc.process_group)
