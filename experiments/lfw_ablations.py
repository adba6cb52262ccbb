"""Ablations of the LFW face recipe: the validation preset with one change at a time.

    python experiments/lfw_ablations.py --config configs/lfw_dev_val.yaml --jobs 4 \\
        --out runs/lfw_ablations.json [--only s32,m03] [--set KEY=VALUE ...]

Each ablation is a run of ``experiments/lfw_face_recipe.py`` with the overrides below (plus the
common ``--set`` ones), in its own run folder ``runs/lfw_abl_<name>``; ``--jobs`` runs go side
by side. The summary (JSON, and a Markdown table on stdout) lists for each run the accuracy on
the validation pairs (threshold from the other fold), ROC AUC, all-vs-all TAR at FAR = 1e-3
(single images and two-template pooling) and the training time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name → (what changes, overrides)
ABLATIONS: dict[str, tuple[str, list[str]]] = {
    "preset": ("the preset as configured", []),
    # NormFace's bound ln((C−1)·P/(1−P)) / cos(θ + m) for C = 498, P = 0.9, θ = 40°, m = 0.5 rad
    "s24": ("scale s = 24 (the bound for m = 0.5 rad)", ["head.margin.scale=24"]),
    "s32": ("scale s = 32", ["head.margin.scale=32"]),
    "s64": ("scale s = 64", ["head.margin.scale=64"]),
    "m0": ("no margin (NormFace)", ["head.margin.m2_rad=0.0"]),
    "m03": ("ArcFace m = 0.3", ["head.margin.m2_rad=0.3"]),
    "cosface": ("CosFace m3 = 0.35 instead of ArcFace",
                ["head.margin.m2_rad=0.0", "head.margin.m3=0.35"]),
    "no_warmup": ("no margin warm-up",
                  ["recipe.margin_warmup_epochs=0", "recipe.margin_ramp_epochs=0"]),
    "pfc03": ("Partial FC sample rate 0.3", ["head.sample_rate=0.3"]),
    "subc3": ("3 sub-centers per class", ["head.num_subcenters=3"]),
    "flip_only": ("augmentation: flip only", [
        "data.augment.max_rotation_deg=0", "data.augment.max_shift_frac=0",
        "data.augment.max_scale_delta=0", "data.augment.color_jitter=0",
    ]),
    "no_extra": ("without the fold-0 (extra) people", ["recipe.train_folds=[1,2,3]"]),
    "in48": ("input 48×48 instead of 64×64", ["data.input_size=48"]),
    "all_people": ("every person, also those with one image", ["recipe.min_images_per_person=1"]),
    # the same at the preset's number of steps: 27 epochs of 4,709 images ≈ 50 of 2,561 (batch 32),
    # the warm-ups scaled to the same steps
    "all_people_eq": ("every person, also those with one image, at the preset's steps", [
        "recipe.min_images_per_person=1", "train.epochs=27", "recipe.margin_warmup_epochs=0.27",
        "recipe.margin_ramp_epochs=0.54", "schedule.warmup_epochs=0.16",
    ]),
    "erase": ("random erasing with p = 0.5", ["data.augment.erase_prob=0.5"]),
    "wd1e3": ("weight decay 1e-3 instead of 5e-4", ["optim.weight_decay=1.0e-3"]),
    "lr005": ("learning rate 0.05 instead of 0.1", ["optim.lr=0.05"]),
    "lr02": ("learning rate 0.2 instead of 0.1", ["optim.lr=0.2"]),
    "ep40": ("40 epochs instead of 50", ["train.epochs=40"]),
    "ep80": ("80 epochs instead of 50", ["train.epochs=80"]),
    "emb128": ("128-d embedding", ["model.embedding_dim=128"]),
    "no_align": ("centred crops, no landmark alignment", ["recipe.align=false"]),
    "mobilefacenet": ("MobileFaceNet backbone", ["model.name=mobilefacenet"]),
    "deeper": ("two IR blocks per stage (iresnet18_half)", ["model.name=iresnet18_half"]),
    # identity-balanced batches of 8 people × 4 images, and FaceNet's triplet loss on them
    "pk_triplet": ("P×K batches (8 × 4) and a semi-hard triplet loss beside ArcFace", [
        "data.pk_identities=8", "data.pk_images=4", "loss.triplet_weight=1.0",
    ]),
    "pk_only": ("P×K batches (8 × 4), ArcFace alone", ["data.pk_identities=8", "data.pk_images=4"]),
    "erase025": ("random erasing with p = 0.25", ["data.augment.erase_prob=0.25"]),
    "narrow": ("3/4 of the width (iresnet_small_narrow, 24-48-96-192)", [
        "model.name=iresnet_small_narrow",
    ]),
    "tiny": ("half the width (iresnet_tiny, 16-32-64-128)", ["model.name=iresnet_tiny"]),
}  # fmt: skip


def run_one(name: str, config: str, common: list[str], log_dir: Path) -> dict:
    _, overrides = ABLATIONS[name]
    sets = [*common, *overrides, f"run.name=lfw_abl_{name}", "run.progress=false"]
    cmd = [sys.executable, str(HERE / "lfw_face_recipe.py"), "--config", config]
    for item in sets:
        cmd += ["--set", item]
    log = log_dir / f"lfw_abl_{name}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    out = {"name": name, "change": ABLATIONS[name][0], "overrides": overrides, "exit_code": code}
    out["wall_seconds"] = time.perf_counter() - t0
    if code == 0:  # the driver's last line: "... results in <run>/recipe_result.json"
        result_file = log.read_text().strip().splitlines()[-1].rsplit("results in ", 1)[1]
        out["result"] = json.loads(Path(result_file).read_text())
    else:
        out["log_tail"] = log.read_text()[-2000:]
    print(f"{name}: exit {code} after {out['wall_seconds']:.0f} s", flush=True)
    return out


def row(entry: dict, source: str) -> str:
    if entry["exit_code"] != 0:
        return f"| {entry['name']} | {entry['change']} | failed | | | | |"
    r = entry["result"]
    v = r["validation"]["model"]
    pairs = v[f"pairs_{source}"]
    ava = v["all_vs_all"]["tar@far=0.001"]
    tmpl = v["templates"]["tar@far=0.001"]
    return (
        f"| {entry['name']} | {entry['change']} | {100 * pairs['accuracy']['mean']:.2f} | "
        f"{pairs['auc']:.4f} | {100 * ava['tar']:.2f} (k={ava['k_false_accepts']}) | "
        f"{100 * tmpl['tar']:.2f} (k={tmpl['k_false_accepts']}) | {r['train_seconds']:.0f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/lfw_dev_val.yaml")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated ablation names")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="runs/lfw_ablations.json")
    parser.add_argument("--source", default="grey", help="pair image source for the table")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(ABLATIONS)
    unknown = [n for n in names if n not in ABLATIONS]
    if unknown:
        parser.error(f"unknown ablation(s) {unknown}; choose from {', '.join(ABLATIONS)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        entries = list(pool.map(lambda n: run_one(n, args.config, args.set, out.parent), names))
    out.write_text(json.dumps(entries, indent=2) + "\n")
    print(
        "| run | change | pair accuracy (%) | ROC AUC | all-vs-all TAR@FAR=1e-3 (%) | "
        "templates TAR@FAR=1e-3 (%) | train s |\n|---|---|---|---|---|---|---|"
    )
    for entry in entries:
        print(row(entry, args.source))
    return 0 if all(e["exit_code"] == 0 for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
