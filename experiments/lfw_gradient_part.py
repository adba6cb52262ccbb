"""A second hand-crafted descriptor beside the one-network model's LTP part: histograms of
gradient orientation, fused as a third part of the score and scored from trained runs.

The one-network model (``configs/lfw_dev_val_onefile.yaml``) scores a pair by the cosine of
``[ê_net, √3 ê_ltp]``. This experiment appends ``√w ê_grad``, so the pair score becomes
``(cos_net + 3 cos_ltp + w cos_grad) / (4 + w)``, with ``ê_grad`` the unit PCA + WCCN projection
of :func:`gradient_orientation_histograms`, fitted on the split's training images as the LTP
part is. Nothing is trained: the networks are the runs given. Run it on the training folds
first (``--set recipe.train_folds=[0,1] --set recipe.val_folds=[2,3]`` with runs trained so)
to choose a setting without folds 4–5::

    python -m experiments.lfw_gradient_part --config configs/lfw_dev_val_onefile.yaml \\
        --runs RUN_0 RUN_1 --settings 12:6:4:600:0.1:1.5 --out gradient.json
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from experiments import lfw_face_recipe as recipe_mod

ORIENTATION_BINS = 9  # unsigned orientations, 20 degrees apart
SIDES_PX = (96, 48)  # the crop and its area-resampled half, as the LTP part


@dataclass(frozen=True)
class GradientSetting:
    """One descriptor and its place in the score: ``cell_px``-pixel cells every ``stride_px``
    pixels, bin sharpness ``power``, ``components`` kept by PCA, WCCN ridge ``ridge`` (in
    units of the mean eigenvalue), fusion weight ``weight`` (``w`` above)."""

    cell_px: int
    stride_px: int
    power: float
    components: int
    ridge: float
    weight: float

    def __str__(self) -> str:
        """The ``--settings`` form, ``CELL:STRIDE:POWER:COMPONENTS:RIDGE:WEIGHT``."""
        fields = (self.cell_px, self.stride_px, self.power, self.components, self.ridge)
        return ":".join(f"{v:g}" for v in (*fields, self.weight))

    @classmethod
    def parse(cls, text: str) -> GradientSetting:
        """``CELL:STRIDE:POWER:COMPONENTS:RIDGE:WEIGHT``, e.g. ``12:6:4:600:0.1:1.5``."""
        parts = text.split(":")
        if len(parts) != 6:
            raise ValueError(
                f"--settings {text!r}: expected CELL:STRIDE:POWER:COMPONENTS:RIDGE:WEIGHT, "
                "e.g. 12:6:4:600:0.1:1.5"
            )
        try:
            cell, stride, components = int(parts[0]), int(parts[1]), int(parts[3])
            power, ridge, weight = float(parts[2]), float(parts[4]), float(parts[5])
        except ValueError as error:
            raise ValueError(f"--settings {text!r}: {error}") from None
        if min(cell, stride, components) < 1 or power <= 0 or ridge <= 0 or weight <= 0:
            raise ValueError(f"--settings {text!r}: every field must be positive")
        return cls(cell, stride, power, components, ridge, weight)


def gradient_orientation_histograms(images, cell_px: int, stride_px: int, power: float):
    """``(N, 1, H, W)`` float tensor → ``(N, D)``: square-rooted cell sums of soft
    orientation votes at each side of :data:`SIDES_PX` (histograms of oriented gradients,
    Dalal and Triggs, CVPR 2005, with soft bins and without block normalisation).

    Per pixel, central differences ``g = (gx, gy)`` (edges replicated) and the unsigned
    orientation ``θ``; bin ``k`` of :data:`ORIENTATION_BINS` (``φ_k = 2πk / 9`` on the
    doubled angle) receives ``|g| · relu(cos(2θ − φ_k))^power``; each ``cell_px`` square every
    ``stride_px`` pixels averages the votes; the result is square-rooted."""
    import torch
    import torch.nn.functional as F

    phi = torch.arange(ORIENTATION_BINS, dtype=images.dtype) * (2 * np.pi / ORIENTATION_BINS)
    features = []
    for side in SIDES_PX:
        x = images if side == images.shape[-1] else F.interpolate(images, (side, side), mode="area")
        x = F.pad(x, (1, 1, 1, 1), mode="replicate")
        gx = x[:, :, 1:-1, 2:] - x[:, :, 1:-1, :-2]
        gy = x[:, :, 2:, 1:-1] - x[:, :, :-2, 1:-1]
        magnitude = torch.sqrt(gx * gx + gy * gy)
        safe = magnitude.clamp_min(1e-12)
        cos2, sin2 = (gx * gx - gy * gy) / safe, 2 * gx * gy / safe  # |g| cos 2θ, |g| sin 2θ
        alignment = (cos2 * phi.cos().view(1, -1, 1, 1) + sin2 * phi.sin().view(1, -1, 1, 1)) / safe
        votes = magnitude * torch.relu(alignment) ** power
        cells = F.avg_pool2d(votes, cell_px, stride_px)
        features.append(torch.sqrt(cells).flatten(1))
    return torch.cat(features, dim=1)


def flip_summed_histograms(images: np.ndarray, setting: GradientSetting, batch_size: int = 256):
    """``(N, D)`` float64: :func:`gradient_orientation_histograms` of each uint8 crop plus
    those of its mirror."""
    import torch

    chunks = []
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = recipe_mod.normalised_faces(images[start : start + batch_size])
            h = sum(
                gradient_orientation_histograms(
                    v, setting.cell_px, setting.stride_px, setting.power
                )
                for v in (x, torch.flip(x, dims=[3]))
            )
            chunks.append(h.double().numpy())
    return np.concatenate(chunks)


def fit_gradient_part(split, setting: GradientSetting):
    """PCA + WCCN (:meth:`partialfc.models.lbp.LbpWccnEmbedder.fit_descriptors`) of the
    training images' flip-summed histograms: ``images → (N, components)`` raw embeddings."""
    from partialfc.models.lbp import LbpWccnEmbedder

    fitted = LbpWccnEmbedder(num_components=setting.components, regularization=setting.ridge)
    try:
        fitted.fit_descriptors(
            flip_summed_histograms(split.train_images, setting), split.train_labels
        )
    except ValueError as error:  # e.g. more components than the training descriptors span
        raise ValueError(f"gradient setting {setting}: {error}") from None
    return lambda images: (
        (flip_summed_histograms(images, setting) - fitted.mean) @ fitted.projection
    )


def _summary(metrics: dict) -> dict:
    out = {}
    for source in ("grey", "colour"):
        pairs = metrics.get(f"pairs_{source}")
        if pairs is not None:
            out[source] = {
                "accuracy": pairs["accuracy"]["mean"],
                "accuracy_own_threshold": float(
                    np.mean(pairs["accuracy"]["per_fold_at_own_threshold"])
                ),
                "auc": pairs["auc"],
            }
    out["tar@far=0.001"] = metrics["all_vs_all"]["tar@far=0.001"]["tar"]
    return out


def run(recipe, runs: list[str], settings: list[GradientSetting]) -> dict:
    """For each run: the one-network model's metrics (``network_and_ltp``), and with each
    setting's gradient part appended (``with_gradient_part``); the gradient part alone once
    per setting (``gradient_part_alone``)."""
    from partialfc.backbone.embedding import embed_array
    from partialfc.eval import l2_normalize

    if not recipe.val_folds:
        raise ValueError("recipe.val_folds is empty: nothing to score")
    if not (recipe.ltp_in_graph and recipe.lbp_weight > 0):
        raise ValueError(
            "the gradient part joins the in-graph LTP model: use a preset with "
            "recipe.ltp_in_graph: true (configs/lfw_dev_val_onefile.yaml)"
        )
    split = recipe_mod.build_split(recipe)
    pair_sets = {s: recipe_mod.pair_images(recipe, split, s) for s in recipe.pair_sources}
    colour = pair_sets["colour"].images if "colour" in pair_sets else split.val_images[:1]
    image_sets = (split.val_images, colour)

    def evaluate(parts: list[tuple[list[np.ndarray], float]]) -> dict:
        joined = [
            np.concatenate([np.sqrt(w) * l2_normalize(p[i]) for p, w in parts], axis=1)
            for i in range(2)
        ]
        return _summary(recipe_mod.evaluate_embeddings(*joined, split, pair_sets))

    gradient_parts = {}
    result: dict = {"gradient_part_alone": [], "runs": []}
    for setting in settings:
        started = time.perf_counter()
        embed = fit_gradient_part(split, setting)
        gradient_parts[setting] = [embed(images) for images in image_sets]
        result["gradient_part_alone"].append(
            {
                "setting": asdict(setting),
                "fit_and_embed_seconds": time.perf_counter() - started,
                **evaluate([(gradient_parts[setting], 1.0)]),
            }
        )
    for path in runs:
        fused = recipe_mod.whitened_run(path, split, recipe)
        # the exported model's output: [ê_net, √w_ltp ê_ltp]
        model = [embed_array(fused, images, 128) for images in image_sets]
        row = {"run": str(path), "network_and_ltp": evaluate([(model, 1.0)])}
        # the model's output already weighs its parts (squared norm 1 + w_ltp): scaled back to it
        scale = 1.0 + recipe.lbp_weight
        row["with_gradient_part"] = [
            {"setting": asdict(s), **evaluate([(model, scale), (gradient_parts[s], s.weight)])}
            for s in settings
        ]
        result["runs"].append(row)
        print(f"{path}: scored", flush=True)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="configs/lfw_dev_val_onefile.yaml")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe override, e.g. recipe.val_folds=[2,3] (repeatable)",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        required=True,
        metavar="RUN",
        help="run folders of the preset, trained on the recipe's training folds",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        required=True,
        metavar="C:S:P:K:R:W",
        help="gradient parts, CELL:STRIDE:POWER:COMPONENTS:RIDGE:WEIGHT each "
        "(no default; the choice of the recipe page: 12:6:4:600:0.1:1.5)",
    )
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    try:
        settings = [GradientSetting.parse(text) for text in args.settings]
    except ValueError as error:
        parser.error(str(error))
    from partialfc.backbone.io import newest_checkpoint

    for path in args.runs:
        if not Path(path).is_dir():
            parser.error(f"--runs: {path} is not a run folder")
        if newest_checkpoint(path) is None:
            parser.error(f"--runs: {path} holds no checkpoint (model.json) to score")
    if not Path(args.out).resolve().parent.is_dir():
        parser.error(f"--out: the folder of {args.out} does not exist")
    try:
        recipe, _ = recipe_mod.load_validation_recipe(args.config, args.set)
        result = run(recipe, args.runs, settings)
    except ValueError as error:  # a bad config, key or setting (ConfigError is one)
        parser.error(str(error))
    result["command"] = "python -m experiments.lfw_gradient_part " + " ".join(argv)
    recipe_mod._atomic_write_json(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
