"""benchmarks/lfw_alignment.py on a few LFW photos: the renderings agree better once aligned,
and the two alignment paths of an aligned export give the same embedding."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.benchmarks.scripts import benchmark_script


def _export(tmp_path, alignment_landmarks):
    from partialfc.deploy import PreprocessingSpec, export_backbone
    from partialfc.models import build_model

    torch.manual_seed(0)
    config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 8, "input_size": 32,
                                                  "in_channels": 1}}  # fmt: skip
    spec = PreprocessingSpec.from_model_config(config)
    if alignment_landmarks is not None:
        spec = replace(spec, alignment_landmarks=alignment_landmarks)
    model = build_model(config["name"], **config["kwargs"]).eval()
    return str(export_backbone(model, spec, tmp_path / "export").onnx_path.parent)


def test_renderings_and_the_direct_alignment_path(shared_data, tmp_path):
    root = shared_data / "lfw_dev"
    with benchmark_script("lfw_alignment") as script:
        recipe = script._recipe()
        stats, photos = script.rendering_stats(recipe, root, limit=6)
        assert stats["photos"] == 6 == len(photos) and stats["grey_faces_found"] == 6
        ncc_before = stats["ncc_centred_vs_grey"]["mean"]
        assert stats["ncc_aligned_vs_aligned"]["mean"] > ncc_before + 0.05
        distance = stats["landmark_distance_to_frame_px"]
        assert distance["after"] < distance["before"]
        frame = recipe.GREY_FRAME_LANDMARKS / 3  # at the 32×32 input
        direct = script.direct_alignment(recipe, photos, _export(tmp_path, frame))
        assert direct["photos"] == 6 and direct["pixel_mean_abs_difference"] < 12
        assert direct["cosine_same_photo"]["min"] > direct["cosine_other_photos_mean"]
        with pytest.raises(ValueError, match="alignment_landmarks"):
            script.direct_alignment(recipe, photos, _export(tmp_path / "plain", None))
