"""Sub-center cleaning: the rule against an independent re-implementation, removal quality on a
set with known flipped labels, sharded heads, and the command's outputs."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from partialfc.tools.cleaning import (
    clean_by_dominant_subcenter,
    load_head_centers,
    own_class_subcenter_cosines,
)
from tests.distributed import run_ranks


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _noisy_geometry(seed=0, classes=24, per_class=30, k=3, dim=48, flip_rate=0.2, hard=0.05):
    """Sub-centers at random directions; a clean sample sits ~25 deg from its class's dominant
    sub-center (a few 'hard' ones next to another sub-center of their class); a flipped sample
    sits next to its true class's dominant center but carries another class's label."""
    rng = np.random.default_rng(seed)
    centers = _unit(rng.normal(size=(classes, k, dim)))
    dominant = rng.integers(0, k, size=classes)
    clean = np.repeat(np.arange(classes), per_class)
    n = len(clean)
    anchor = centers[clean, dominant[clean]]
    is_hard = rng.random(n) < hard
    other = (dominant[clean] + 1) % k
    anchor[is_hard] = centers[clean[is_hard], other[is_hard]]
    # tangent noise at ~25 degrees
    noise = rng.normal(size=(n, dim))
    noise -= (noise * anchor).sum(1, keepdims=True) * anchor
    noise = _unit(noise)
    angle = np.deg2rad(25.0)
    emb = math.cos(angle) * anchor + math.sin(angle) * noise
    flipped = rng.choice(n, size=int(round(flip_rate * n)), replace=False)
    labels = clean.copy()
    labels[flipped] = (clean[flipped] + rng.integers(1, classes, size=len(flipped))) % classes
    table = torch.from_numpy(centers.reshape(classes * k, dim)).float()
    return emb.astype(np.float32), labels, clean, labels != clean, table, k


def _reference(own_cos, labels, num_classes, threshold_deg):
    """Plain-Python version of the rule: vote, dominant, angle, keep."""
    assigned = [int(np.argmax(row)) for row in own_cos]
    votes = {c: Counter() for c in range(num_classes)}
    for a, y in zip(assigned, labels, strict=True):
        votes[int(y)][a] += 1
    dominant = {}
    for c, counter in votes.items():
        if counter:
            best = max(counter.values())
            dominant[c] = min(s for s, v in counter.items() if v == best)
    angles = [
        math.degrees(math.acos(max(-1.0, min(1.0, float(row[dominant[int(y)]])))))
        for row, y in zip(own_cos, labels, strict=True)
    ]
    keep = [a <= threshold_deg for a in angles]
    is_dom = [a == dominant[int(y)] for a, y in zip(assigned, labels, strict=True)]
    return np.array(angles), np.array(keep), np.array(is_dom)


def test_rule_matches_reference_and_removes_mostly_flipped_samples():
    emb, labels, clean, noisy, table, k = _noisy_geometry()
    own_cos = own_class_subcenter_cosines(emb, labels, table, k, chunk=97)
    # the (N, K) cosines are the rows of the full cosine matrix at each sample's own class
    full = emb @ table.numpy().T
    cols = labels[:, None] * k + np.arange(k)
    np.testing.assert_allclose(own_cos, np.take_along_axis(full, cols, 1), atol=1e-5)

    num_classes = int(clean.max()) + 1
    result = clean_by_dominant_subcenter(own_cos, labels, num_classes, 75.0, noisy_mask=noisy)
    angles, keep, is_dom = _reference(own_cos, labels, num_classes, 75.0)
    np.testing.assert_allclose(result.angle_deg, angles, atol=1e-3)
    np.testing.assert_array_equal(result.keep, keep)
    np.testing.assert_array_equal(result.is_dominant, is_dom)

    quality = result.removal_quality()
    # flipped samples are ~90 deg from every center of the wrong class: nearly all removed;
    # the only clean losses are the hard samples that sit next to a non-dominant sub-center
    assert quality["recall"] >= 0.95
    assert quality["precision"] >= 0.75
    assert quality["noise_rate_before"] == pytest.approx(0.2, abs=1e-3)
    assert quality["noise_rate_after"] <= 0.02
    groups = result.groups()
    assert sum(groups.values()) == len(labels)
    assert groups["dominant_noisy"] + groups["non_dominant_noisy"] == int(noisy.sum())
    per_class = result.per_class()
    assert per_class["samples"].sum() == len(labels)
    assert per_class["kept"].sum() == int(result.keep.sum())


def test_threshold_is_inclusive_and_ties_go_to_lowest_subcenter():
    # class 0: two samples pick sub-center 1, two pick 0 -> tie -> dominant 0
    own_cos = np.array(
        [[0.9, 0.1], [0.8, 0.0], [0.1, 0.9], [0.0, 0.95], [math.cos(math.radians(75.0)), 0.0]],
        dtype=np.float32,
    )
    labels = np.array([0, 0, 0, 0, 1])
    result = clean_by_dominant_subcenter(own_cos, labels, num_classes=3, threshold_deg=75.0)
    assert result.dominant_subcenter.tolist() == [0, 0, -1]
    assert result.keep.tolist() == [True, True, False, False, True]
    assert result.groups() == {"dominant": 3, "non_dominant": 2}


def test_bad_input_is_rejected_with_the_argument_named():
    with pytest.raises(ValueError, match="threshold_deg"):
        clean_by_dominant_subcenter(np.zeros((2, 3)), np.array([0, 1]), 2, threshold_deg=0.0)
    with pytest.raises(ValueError, match="num_classes"):
        clean_by_dominant_subcenter(np.zeros((2, 3)), np.array([0, 5]), 2)
    with pytest.raises(ValueError, match="not a multiple"):
        own_class_subcenter_cosines(np.zeros((1, 4)), np.array([0]), torch.zeros(5, 4), 3)


def _write_meta(checkpoint, num_classes, dim, k, kind="partial_fc"):
    """The ``meta.json`` of a training checkpoint: its config says which head to build."""
    config = {"model": {"embedding_dim": dim}, "head": {"kind": kind, "num_subcenters": k}}
    meta = {"config": config, "num_classes": num_classes}
    (checkpoint / "meta.json").write_text(json.dumps(meta))


def _save_sharded_head(rank, world_size, directory, num_classes, dim, k, seed):
    from partialfc.classifier import PartialFC, save_partial_fc_checkpoint
    from partialfc.losses import ArcFaceMargin

    head = PartialFC(num_classes, dim, ArcFaceMargin(), num_subcenters=k, seed=seed)
    save_partial_fc_checkpoint(directory, head)
    return head.block.size


def test_centers_of_a_two_rank_head_are_gathered_in_class_order(tmp_path):
    from partialfc.classifier import init_center_rows

    num_classes, dim, k, seed = 7, 5, 3, 11
    sizes = run_ranks(
        _save_sharded_head, 2, args=(str(tmp_path / "head"), num_classes, dim, k, seed)
    )
    assert sizes == [4, 3]
    _write_meta(tmp_path, num_classes, dim, k)
    centers, got_k = load_head_centers(tmp_path)
    assert got_k == k
    # the initial table is the same for any number of ranks: the single-rank build is the truth
    expected = init_center_rows(num_classes, dim, k, seed, 0, num_classes)
    torch.testing.assert_close(centers, expected)


def test_the_centers_of_a_dense_sub_center_head_come_through_the_head_contract(tmp_path):
    from partialfc.losses import ArcFaceMargin, MarginSoftmaxHead

    torch.manual_seed(3)
    head = MarginSoftmaxHead(4, 6, ArcFaceMargin(), num_subcenters=2)
    head.save_state(tmp_path / "head")
    _write_meta(tmp_path, 4, 6, 2, kind="margin_softmax")
    centers, k = load_head_centers(tmp_path)
    assert k == 2 and centers.shape == (8, 6)
    torch.testing.assert_close(centers, head.weight.detach())
    from partialfc.losses.triplet import TripletLoss

    TripletLoss().save_state(tmp_path / "pair" / "head")
    _write_meta(tmp_path / "pair", 4, 6, 1, kind="triplet")
    with pytest.raises(ValueError, match="head.kind='triplet'. has no centers"):
        load_head_centers(tmp_path / "pair")


def test_clean_command_writes_report_and_cleaned_set(tmp_path):
    from partialfc.backbone.io import save_backbone
    from partialfc.classifier import PartialFC, save_partial_fc_checkpoint
    from partialfc.cli import main
    from partialfc.losses import ArcFaceMargin
    from partialfc.models import build_model

    rng = np.random.default_rng(0)
    classes, per_class = 6, 8
    clean = np.repeat(np.arange(classes), per_class)
    labels = clean.copy()
    labels[::5] = (labels[::5] + 1) % classes
    images = rng.integers(0, 256, size=(len(labels), 28, 28), dtype=np.uint8)
    data = tmp_path / "noisy.npz"
    np.savez(data, images=images, labels=labels, clean_labels=clean)

    ckpt = tmp_path / "run" / "checkpoints" / "step-00000010"
    ckpt.mkdir(parents=True)
    config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 16, "input_size": 28,
                                                  "in_channels": 1}}  # fmt: skip
    save_backbone(build_model(**{"name": config["name"], **config["kwargs"]}), config, ckpt)
    head = PartialFC(classes, 16, ArcFaceMargin(), num_subcenters=3)
    save_partial_fc_checkpoint(ckpt / "head", head)
    _write_meta(ckpt, classes, 16, 3)

    out = tmp_path / "cleaned"
    argv = ["clean", str(tmp_path / "run"), "--out", str(out), "--data-source", "npz",
            "--data-path", str(data), "--threshold-deg", "80", "--batch-size", "16"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["samples"] == len(labels)
    assert sum(report["groups"].values()) == len(labels)
    assert set(report["groups"]) == {
        "dominant_clean", "dominant_noisy", "non_dominant_clean", "non_dominant_noisy"
    }  # fmt: skip
    assert report["removal_vs_ground_truth"]["noise_rate_before"] == pytest.approx(
        float((labels != clean).mean())
    )
    assert report["kept"] + report["removed"] == len(labels)
    rows = (out / "per_class.csv").read_text().strip().splitlines()
    assert len(rows) == classes + 1
    assert sum(int(r.split(",")[2]) for r in rows[1:]) == report["kept"]
    with np.load(out / "cleaned.npz") as cleaned:
        assert len(cleaned["labels"]) == report["kept"]
        np.testing.assert_array_equal(cleaned["images"], images[cleaned["indices"]])
        np.testing.assert_array_equal(cleaned["clean_labels"], clean[cleaned["indices"]])
    assert (out / "angles.png").stat().st_size > 1000
    assert len((out / "kept.lst").read_text().splitlines()) == report["kept"]
    assert not list(out.glob(".embeddings*"))
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.iterdir())  # group/other-readable
