"""bf16 autocast on CPU: the backbone runs in bf16, the head (margin math) receives fp32."""

from __future__ import annotations

import math

import pytest
import torch

from partialfc.train.engine import Trainer, resolve_precision
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config


def test_bf16_backbone_fp32_head(tmp_path):
    cfg = tiny_config(tmp_path, "data.batch_size=20", "train.epochs=0.2", "train.precision=bf16")
    trainer = Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(10),
    )
    seen = {}

    def backbone_out(module, inputs, output):
        seen["bb"] = output.dtype

    def head_in(module, args):
        seen["head"] = args[0].dtype

    trainer.backbone.net[-1].register_forward_hook(backbone_out)
    trainer.head.register_forward_pre_hook(head_in)
    result = trainer.fit()
    assert seen == {"bb": torch.bfloat16, "head": torch.float32}
    assert all(math.isfinite(v) for v in result.losses)
    assert all(p.dtype == torch.float32 for p in trainer.backbone.parameters())


def test_precision_choices():
    assert resolve_precision("auto", torch.device("cpu")) is None
    assert resolve_precision("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="fp16.*needs a GPU"):
        resolve_precision("fp16", torch.device("cpu"))
