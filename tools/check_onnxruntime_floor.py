"""Check for real that exports load and match PyTorch on the oldest declared onnxruntime.

    python tools/check_onnxruntime_floor.py [--ort 1.16.3] [--opsets 11 13 18] [--out r.json]

Exports a small backbone at each opset with this environment, saves reference PyTorch
outputs, then creates a throwaway virtual environment with ``onnxruntime==<--ort>`` (and
numpy<2, which that release needs), runs every export there and compares. Needs network access
to the package index; prints one line per opset and exits non-zero on any failure. ``--out``
also writes the results (opset, IR version, max |diff| per export, versions, date) as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import numpy as np
import onnx
import torch

TOLERANCE = 1e-4

RUNNER = """
import json, sys, numpy as np, onnxruntime as ort
out = {}
for path, ref in json.loads(sys.argv[1]).items():
    x = np.load(ref)["x"]; expected = np.load(ref)["y"]
    try:
        s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        got = s.run(None, {s.get_inputs()[0].name: x})[0]
        out[path] = {"ok": True, "max_abs_diff": float(np.abs(got - expected).max())}
    except Exception as err:
        out[path] = {"ok": False, "error": str(err)[:300]}
print(json.dumps({"onnxruntime": ort.__version__, "results": out}))
"""


def main() -> int:
    from partialfc.deploy import PreprocessingSpec
    from partialfc.deploy.export import export_backbone
    from partialfc.models import build_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ort", default="1.16.3", help="onnxruntime version to test")
    parser.add_argument("--opsets", type=int, nargs="+", default=[11, 13, 18])
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args()
    config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 32, "input_size": 28}}
    torch.manual_seed(0)
    model = build_model(config["name"], **config["kwargs"]).eval()
    spec = PreprocessingSpec.from_model_config(config)
    with tempfile.TemporaryDirectory(prefix="ort-floor-") as tmp:
        tmp = Path(tmp)
        x = spec.preprocess(np.random.default_rng(0).integers(0, 256, (4, 28, 28, 3), np.uint8))
        with torch.no_grad():
            y = model(torch.from_numpy(x)).numpy()
        jobs, meta = {}, {}
        for opset in args.opsets:
            result = export_backbone(model, spec, tmp / f"opset{opset}", opset=opset)
            np.savez(tmp / f"ref{opset}.npz", x=x, y=y)
            jobs[str(result.onnx_path)] = str(tmp / f"ref{opset}.npz")
            meta[str(result.onnx_path)] = (opset, result.ir_version)
        env = tmp / "venv"
        venv.create(env, with_pip=True)
        python = env / "bin" / "python"
        subprocess.run(
            [python, "-m", "pip", "install", "-q", f"onnxruntime=={args.ort}", "numpy<2"],
            check=True,
        )
        run = subprocess.run(
            [python, "-c", RUNNER, json.dumps(jobs)], check=True, capture_output=True, text=True
        )
        report = json.loads(run.stdout)
    rows = []
    for path, outcome in report["results"].items():
        opset, ir = meta[path]
        ok = outcome["ok"] and outcome["max_abs_diff"] < TOLERANCE
        rows.append({"opset": opset, "ir_version": ir, "passed": ok, **outcome})
        detail = f"max |diff| {outcome['max_abs_diff']:.2g}" if outcome["ok"] else outcome["error"]
        status = "ok" if ok else "FAIL"
        print(f"onnxruntime {report['onnxruntime']}: opset {opset} IR {ir}: {status} ({detail})")
    passed = all(row["passed"] for row in rows)
    if args.out is not None:
        from partialfc.atomic import atomic_write_bytes

        result = {
            "date": datetime.date.today().isoformat(),
            "onnxruntime": report["onnxruntime"],
            "exported_with": {"torch": torch.__version__, "onnx": onnx.__version__},
            "model": config,
            "batch": int(x.shape[0]),
            "pytorch_output_max_abs": float(np.abs(y).max()),
            "tolerance_max_abs_diff": TOLERANCE,
            "passed": passed,
            "exports": [{k: v for k, v in row.items() if k != "ok"} for row in rows],
        }
        atomic_write_bytes(args.out, (json.dumps(result, indent=2) + "\n").encode())
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
