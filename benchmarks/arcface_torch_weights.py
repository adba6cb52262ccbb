"""Imported arcface_torch weights compute what InsightFace's own networks compute.

For every network of ``arcface_torch``'s ``get_model``, this builds InsightFace's module from a
local checkout of ``deepinsight/insightface`` (``--insightface``: the repository root; its
``recognition/arcface_torch`` is put on ``sys.path`` and ``backbones.get_model`` imported as it
is, never copied), fills it with random weights (convolution / linear weights scaled by
``1/sqrt(fan_in)``, PReLU slopes, LayerNorm and BatchNorm affine parameters, and BatchNorm
running statistics all random, so every layer matters), saves its ``state_dict()`` as
``backbone.pth``, converts that with ``partialfc import-weights`` (the public
:func:`partialfc.tools.arcface_torch.weights.import_weights`), loads the model directory with
:meth:`partialfc.backbone.embedder.Embedder.load` and compares embeddings of the same random
112×112 RGB images: InsightFace's side gets ``(x − 127.5) / 127.5`` as its ``inference.py``
does, partialfc's side the uint8 images through the directory's ``preprocessing.json``. Both in
eval mode, float32, on the CPU (``fp16=False``; on a CPU ``torch.cuda.amp.autocast`` regions
are inactive). Reported per network: max |Δ| over all embedding entries, the largest entry
(scale), and the min cosine between the two embeddings of an image.

arcface_torch's ViT imports ``timm.models.layers`` (``DropPath``, ``to_2tuple``,
``trunc_normal_``); without timm installed, a stand-in module provides these three (DropPath
is the identity in eval mode). Networks above ``--max-params`` parameters are listed with
the reason and not run (the memory of four copies of their weights).

    python benchmarks/arcface_torch_weights.py --insightface /path/to/insightface \\
        [--networks r18 mbf ...] [--inputs 100] [--out FILE]

Rows of an existing ``--out`` file (default ``benchmarks/results/arcface_torch_weights.json``)
are kept and replaced network by network, so the large networks can run one at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

from partialfc.backbone.embedder import Embedder
from partialfc.tools.arcface_torch.weights import NETWORKS, import_weights

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "arcface_torch_weights.json"
TARGET_MIN_COSINE = 0.99999


def import_get_model(insightface: Path):
    """``backbones.get_model`` of the checkout at ``insightface`` (root or arcface_torch)."""
    for candidate in (insightface / "recognition" / "arcface_torch", insightface):
        if (candidate / "backbones" / "__init__.py").is_file():
            break
    else:
        raise SystemExit(f"--insightface {insightface}: no recognition/arcface_torch/backbones")
    try:
        import timm.models.layers  # noqa: F401
    except ImportError:
        _install_timm_stand_in()
    sys.path.insert(0, str(candidate))
    from backbones import get_model

    return get_model


def _install_timm_stand_in() -> None:
    class DropPath(nn.Module):  # stochastic depth: the identity in eval mode
        def __init__(self, p: float = 0.0):
            super().__init__()
            self.p = p

        def forward(self, x):
            return x

    layers = types.ModuleType("timm.models.layers")
    layers.DropPath = DropPath
    layers.to_2tuple = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    layers.trunc_normal_ = nn.init.trunc_normal_
    sys.modules.setdefault("timm", types.ModuleType("timm"))
    sys.modules.setdefault("timm.models", types.ModuleType("timm.models"))
    sys.modules["timm.models.layers"] = layers


def randomise(model: nn.Module, generator: torch.Generator) -> None:
    """Random weights that keep activations finite, and random BatchNorm statistics."""

    def uniform(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=generator) * (hi - lo) + lo)

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator))
                module.weight.mul_(1.0 / math.sqrt(fan_in))
                if module.bias is not None:
                    uniform(module.bias, -0.1, 0.1)
            elif isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)):
                uniform(module.weight, 0.5, 1.5)
                uniform(module.bias, -0.1, 0.1)
                if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
                    uniform(module.running_mean, -0.1, 0.1)
                    uniform(module.running_var, 0.5, 1.5)
            elif isinstance(module, nn.PReLU):
                uniform(module.weight, 0.0, 0.5)
        for name, param in model.named_parameters(recurse=True):
            if name in ("pos_embed", "mask_token"):
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))


def compare(get_model, network: str, inputs: int, batch: int, workdir: Path, seed: int) -> dict:
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    reference = get_model(network, fp16=False, num_features=512).eval()
    randomise(reference, generator)
    weights = workdir / f"{network}.pth"
    torch.save(reference.state_dict(), weights)
    images = np.random.default_rng(seed).integers(0, 256, (inputs, 112, 112, 3), dtype=np.uint8)
    expected = []
    with torch.no_grad():
        for lo in range(0, inputs, batch):  # inference.py: RGB, (x - 127.5) / 127.5, NCHW
            x = torch.from_numpy(images[lo : lo + batch]).permute(0, 3, 1, 2).float()
            expected.append(reference((x - 127.5) / 127.5).numpy())
    expected = np.concatenate(expected).astype(np.float64)
    num_params = sum(p.numel() for p in reference.parameters())
    del reference
    result = import_weights(weights, network, workdir / network)
    got = Embedder.load(workdir / network).embed_raw(images, batch_size=batch).astype(np.float64)
    cos = (expected * got).sum(1) / (np.linalg.norm(expected, axis=1) * np.linalg.norm(got, axis=1))
    return {
        "network": network,
        "partialfc_model": result.model_name,
        "tensors": result.num_tensors,
        "parameters": num_params,
        "inputs": inputs,
        "max_abs_delta": float(np.abs(expected - got).max()),
        "max_abs_embedding": float(np.abs(expected).max()),
        "min_cosine": float(cos.min()),
        "passed": bool(cos.min() >= TARGET_MIN_COSINE),
        "seconds": round(time.perf_counter() - start, 1),
    }


def parameter_count(network: str) -> int:
    """Parameters of ``network`` (partialfc's equal module, built without memory)."""
    from partialfc.models import build_model

    with torch.device("meta"):
        return sum(p.numel() for p in build_model(NETWORKS[network]).parameters())


def write_report(args, rows: list[dict]) -> dict:
    """The JSON report of ``rows`` merged into ``args.out`` (atomic; after every network)."""
    from partialfc.atomic import atomic_write_bytes

    rows = list(rows)
    if args.out.is_file():  # keep the rows of networks not run this time
        done = {r["network"] for r in rows}
        earlier = json.loads(args.out.read_text()).get("networks", [])
        rows += [r for r in earlier if r["network"] not in done]
    rows.sort(key=lambda r: list(NETWORKS).index(r["network"]))
    run = [r for r in rows if "min_cosine" in r]
    report = {
        "what": "arcface_torch backbone -> partialfc import-weights -> Embedder, against "
        "InsightFace's own module on the same images",
        "command": "OMP_NUM_THREADS=1 python benchmarks/arcface_torch_weights.py "
        f"--insightface INSIGHTFACE --networks NAME... --inputs {args.inputs} --seed {args.seed}",
        "target_min_cosine": TARGET_MIN_COSINE,
        "all_run_passed": all(r["passed"] for r in run),
        "device": "cpu",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs shared with other jobs "
        f"(seconds are wall clock under that load), torch {torch.__version__}",
        "threads": torch.get_num_threads(),
        "networks": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out, (json.dumps(report, indent=2) + "\n").encode())
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--insightface", required=True, type=Path, help="insightface checkout")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--inputs", type=int, default=100, help="random images per network")
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-params", type=float, default=3e8, help="skip larger networks (0: no limit)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    get_model = import_get_model(args.insightface)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for network in args.networks:
            count = parameter_count(network)
            if args.max_params and count > args.max_params:
                rows.append(
                    {
                        "network": network,
                        "partialfc_model": NETWORKS[network],
                        "parameters": count,
                        "not_run": f"{count / 1e6:.0f}M parameters: four float32 copies "
                        f"(~{16 * count / 1e9:.0f} GB) exceed this machine's shared memory; "
                        "run with --max-params 0 on a larger one",
                    }
                )
                print(f"{network}: not run ({count / 1e6:.0f}M parameters)", flush=True)
                write_report(args, rows)
                continue
            row = compare(get_model, network, args.inputs, args.batch, Path(tmp), args.seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_report(args, rows)
            for leftover in Path(tmp).iterdir():  # free the disk between networks
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    report = write_report(args, rows)
    print(f"written {args.out}")
    return 0 if report["all_run_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
