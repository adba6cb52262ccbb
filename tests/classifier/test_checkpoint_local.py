"""Single-process checkpoint checks (the 2 -> 3 rank resharding test is in the distributed file)."""

from __future__ import annotations

import json

import pytest
import torch

from partialfc.classifier import (
    PartialFC,
    RowSparseAdamW,
    load_partial_fc_checkpoint,
    save_partial_fc_checkpoint,
)
from partialfc.losses.margins import CosFaceMargin

D = 8


def _model(dtype=torch.bfloat16):
    pfc = PartialFC(40, D, CosFaceMargin(0.35, 16.0), sample_rate=0.3, storage_dtype=dtype,
                    num_subcenters=2, seed=9)  # fmt: skip
    return pfc, RowSparseAdamW(pfc, lr=1e-2, weight_decay=0.1)


def _step(pfc, opt, seed):
    gen = torch.Generator().manual_seed(seed)
    loss = pfc(torch.randn(6, D, generator=gen), torch.randint(0, 40, (6,), generator=gen))
    loss.backward()
    opt.step()
    return loss.item()


def test_adamw_bfloat16_round_trip_continues_identically(tmp_path):
    pfc, opt = _model()
    for s in range(3):
        _step(pfc, opt, s)
    save_partial_fc_checkpoint(tmp_path / "ckpt", pfc, opt)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "manifest.json",
        "shard-00000-of-00001.safetensors",
    ]
    assert not (tmp_path / "ckpt.partial").exists()
    expected = [_step(pfc, opt, s) for s in (3, 4)]

    fresh, fresh_opt = _model()
    load_partial_fc_checkpoint(tmp_path / "ckpt", fresh, fresh_opt)
    assert fresh.sampling_step == 3 and fresh_opt.num_steps == 3
    assert [_step(fresh, fresh_opt, s) for s in (3, 4)] == pytest.approx(expected, rel=1e-6)
    assert torch.equal(fresh_opt.row_steps, opt.row_steps)

    save_partial_fc_checkpoint(tmp_path / "ckpt", pfc, opt)  # overwriting replaces atomically
    assert json.loads((tmp_path / "ckpt" / "manifest.json").read_text())["sampling_step"] == 5


def test_bad_checkpoints_are_named(tmp_path):
    pfc, opt = _model()
    with pytest.raises(ValueError, match="manifest.json: not found"):
        load_partial_fc_checkpoint(tmp_path, pfc)
    save_partial_fc_checkpoint(tmp_path / "c", pfc)  # centers only
    with pytest.raises(ValueError, match="holds no optimizer state"):
        load_partial_fc_checkpoint(tmp_path / "c", pfc, opt)
    other = PartialFC(40, D, CosFaceMargin(), num_subcenters=3)
    with pytest.raises(ValueError, match="num_subcenters=2 but this PartialFC has 3"):
        load_partial_fc_checkpoint(tmp_path / "c", other)
    (tmp_path / "c" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_partial_fc_checkpoint(tmp_path / "c", pfc)
