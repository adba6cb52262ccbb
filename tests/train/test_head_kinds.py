"""Every ``head.kind`` trains through the same Trainer.

For each kind, on real Omniglot drawings: the trainer's first loss equals the loss of a copy of
its head (rebuilt from the config, state restored through the head contract) on the same
batch; one step of the copy's own optimizer leaves the same centers as the trainer's step; and
a checkpoint round-trips the head and its optimizer bit for bit, so the resumed run's next
loss equals the uninterrupted one's.
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from partialfc.backbone.pixels import normalize_batch
from partialfc.losses.contract import Head, OptimizerSettings
from partialfc.train.builders import HEAD_BUILDERS, build_head
from partialfc.train.config import ConfigError
from partialfc.train.engine import Trainer
from tests.train.helpers import TINY_MODEL_CONFIG, omniglot_subset, tiny_backbone, tiny_config

NUM_CLASSES = 12
PK = ("data.pk_identities=4", "data.pk_images=4", "data.batch_size=16")
KINDS = {
    "partial_fc": ("head.num_subcenters=2",),
    "margin_softmax": ("head.num_subcenters=2",),
    "softmax": (),
    "proxy_nca": ("head.proxy_scale=4.0",),
    "triplet": PK + ("head.triplet_mining=batch_hard",),
    "contrastive": PK,
}


def test_every_builder_has_a_test():
    from partialfc.train.config import allowed_values

    assert sorted(KINDS) == sorted(HEAD_BUILDERS)
    assert allowed_values("head.kind") == tuple(HEAD_BUILDERS)  # the config accepts each one


def test_every_storage_dtype_the_config_accepts_is_one_partial_fc_stores():
    from partialfc.classifier.storage import SUPPORTED_DTYPES
    from partialfc.train.builders import _DTYPES
    from partialfc.train.config import _CHOICES

    assert [_DTYPES[name] for name in _CHOICES["head.storage_dtype"]] == list(SUPPORTED_DTYPES)


def _trainer(run_dir, kind, *extra):
    cfg = tiny_config(
        run_dir,
        f"head.kind={kind}",
        "data.batch_size=16",
        "optim.name=sgd",
        "optim.lr=0.5",
        "train.epochs=1",
        *KINDS[kind],
        *extra,
    )
    return Trainer(
        cfg,
        backbone=tiny_backbone(0),
        model_config=TINY_MODEL_CONFIG,
        train_set=omniglot_subset(NUM_CLASSES),
    )


def _batch(trainer):
    images, labels, indices = next(iter(trainer._loader()))
    return images, labels, indices


def _flatten(obj, prefix=""):
    """Nested containers -> ``{path: value}`` with tensors as (dtype, shape, raw bytes)."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return {prefix: (t.dtype, tuple(t.shape), t.view(-1).view(torch.uint8).numpy().tobytes())}
    else:
        return {prefix: obj}
    out = {}
    for key, value in items:
        out.update(_flatten(value, f"{prefix}/{key}"))
    return out


def _files(directory):
    """File name -> content: bytes, or the tensors' bytes and the metadata of a tensor file
    (the zip records of a ``torch.save`` file carry the name of its temporary file)."""
    out = {}
    for p in sorted(directory.iterdir()):
        if p.suffix == ".pt":
            out[p.name] = _flatten(torch.load(p, weights_only=True))
        elif p.suffix == ".safetensors":  # its metadata mapping has no fixed order
            with safe_open(str(p), "pt") as f:
                tensors = {key: f.get_tensor(key) for key in f.keys()}
                out[p.name] = (f.metadata(), _flatten(tensors))
        elif p.is_file():
            out[p.name] = p.read_bytes()
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_trainer_steps_the_configured_head_like_the_head_alone(tmp_path, kind):
    trainer = _trainer(tmp_path / "a", kind)
    head = trainer.head
    assert isinstance(head, Head) and head is trainer.head
    assert (
        type(head).__name__
        == {
            "partial_fc": "PartialFC",
            "margin_softmax": "MarginSoftmaxHead",
            "softmax": "SoftmaxHead",
            "proxy_nca": "ProxyNCALoss",
            "triplet": "TripletLoss",
            "contrastive": "ContrastiveLoss",
        }[kind]
    )

    # a second copy of the head, its state restored through the contract
    cfg = trainer.cfg
    copy, _ = build_head(cfg.head, 16, NUM_CLASSES, cfg.train.seed, torch.device("cpu"))
    head.save_state(tmp_path / "initial")
    copy.load_state(tmp_path / "initial")
    copy_opt = copy.make_optimizer(OptimizerSettings(name="sgd", lr=0.5, momentum=0.9))

    images, labels, indices = _batch(trainer)
    with torch.no_grad():
        embeddings = trainer.backbone(normalize_batch(images))
    expected = copy(embeddings.clone().requires_grad_(), labels)
    loss = trainer.train_step(images, labels, indices)
    assert loss == pytest.approx(float(expected.detach()), rel=1e-6, abs=1e-7)
    assert loss > 0

    expected.backward()
    copy_opt.step()
    centers = head.class_centers()
    if kind in ("triplet", "contrastive"):
        assert centers is None and copy.class_centers() is None
        assert list(head.parameters()) == []
    else:
        assert torch.equal(centers, copy.class_centers())
        initial = build_head(cfg.head, 16, NUM_CLASSES, cfg.train.seed, torch.device("cpu"))[0]
        initial.load_state(tmp_path / "initial")
        assert not torch.equal(centers, initial.class_centers())  # the step moved them
    if kind in ("partial_fc", "margin_softmax"):
        assert trainer.margin is head.angular_margin() and trainer.margin.scale == 16.0
    else:
        assert trainer.margin is None and head.angular_margin() is None


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_checkpoint_round_trips_every_head_bit_for_bit(tmp_path, kind):
    trainer = _trainer(tmp_path / "a", kind)
    for _ in range(2):
        images, labels, indices = _batch(trainer)
        trainer.train_step(images, labels, indices)
        trainer.sampler.advance(trainer.global_batch)
        trainer.step += 1
        trainer.batches_in_epoch += 1
    path = trainer.save_checkpoint()
    assert (path / "head").is_dir() and (path / "backbone.safetensors").is_file()
    resumed = _trainer(tmp_path / "b", kind, f"checkpoint.resume={path}")
    assert resumed.step == 2

    trainer.head.save_state(tmp_path / "h1", trainer.head_optimizer)
    resumed.head.save_state(tmp_path / "h2", resumed.head_optimizer)
    first, second = _files(tmp_path / "h1"), _files(tmp_path / "h2")
    assert first.keys() == second.keys() and first == second

    images, labels, indices = _batch(trainer)
    assert torch.equal(images, _batch(resumed)[0])
    assert trainer.train_step(images, labels, indices) == resumed.train_step(
        images, labels, indices
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (("head.kind=softmax", "head.sample_rate=0.5"), "head.sample_rate=0.5 is a Partial FC"),
        (("head.kind=proxy_nca", "head.num_subcenters=3"), "head.num_subcenters=3 needs"),
        (("head.kind=triplet",), "head.kind='triplet' needs P×K batches"),
        (("head.kind=contrastive", "head.contrastive_margin=3"), "head.contrastive_margin=3.0"),
        (("head.kind=arcface",), "head.kind='arcface': choose one of partial_fc"),
        (("head.storage_dtype=float16",), "head.storage_dtype='float16': choose one of float32"),
    ],
)
def test_head_settings_that_do_not_fit_the_kind_are_named_errors(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("×", ".")):
        tiny_config(tmp_path, *overrides)
