"""What a face model costs to ship and to run, as JSON: file sizes and milliseconds a face.

For an export folder (``backbone.onnx`` + its preprocessing spec, as ``partialfc export`` or
the LFW recipe writes it) and, optionally, a fused model's descriptor (``lbp_wccn.npz``):

* the size of every file a deployment needs (``backbone.onnx``, the descriptor);
* milliseconds per face for the network with the flip test (the face and its mirror, two
  ONNX runs through onnxruntime; one run for a network whose graph embeds the mirror itself,
  ``partialfc.models.ltp_fused.FLIP_TEST_IN_GRAPH``), for the descriptor (one call, which
  averages the face's and its mirror's histograms when the descriptor was fitted that way) and
  for both together;
  best of ``--repeat`` passes over ``--faces`` faces in batches of ``--batch``, after one
  warm-up pass, at ``--threads`` compute threads (onnxruntime's intra-op pool, torch and the
  BLAS libraries).

The faces are seeded random 96×96 uint8 grey crops (the LFW recipe's aligned crop size; the
network gets their area resize to its input size): the cost does not depend on the pixels.

    python benchmarks/face_embedding_cost.py --export runs/lfw_dev_final_fused/export \\
        --lbp runs/lfw_dev_final_fused/export/lbp_wccn.npz --threads 1 --out cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

CROP_SIZE = 96  # the LFW recipe's aligned grey crop


def _limit_threads(threads: int) -> None:
    """Cap the BLAS / OpenMP pools before numpy and torch start them."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)


def _best_ms_per_face(fn, faces, batch: int, repeat: int) -> float:
    """Best of ``repeat`` timed passes (after one warm-up pass) of ``fn`` over ``faces`` in
    batches of ``batch``, in milliseconds per face."""
    batches = [faces[i : i + batch] for i in range(0, len(faces), batch)]
    for b in batches:
        fn(b)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for b in batches:
            fn(b)
        best = min(best, time.perf_counter() - start)
    return 1000.0 * best / len(faces)


def _cpu() -> dict:
    flags: set[str] = set()
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    kinds = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return {"model": model, "cores": os.cpu_count(), "flags": kinds}


def measure(export: Path, lbp: Path | None, faces: int, batch: int, repeat: int, threads: int):
    import numpy as np
    import onnxruntime as ort
    import torch

    from partialfc.backbone.embedder import Embedder
    from partialfc.eval import resize_images

    torch.set_num_threads(threads)
    onnx_path = export / "backbone.onnx"
    if not onnx_path.is_file():
        raise FileNotFoundError(f"{export}: no backbone.onnx (an export folder is expected)")
    embedder = Embedder.load(export, backend="onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    size = tuple(embedder.spec.input_size)
    crops = np.random.default_rng(0).integers(0, 256, (faces, CROP_SIZE, CROP_SIZE), np.uint8)

    from partialfc.models.ltp_fused import FLIP_TEST_IN_GRAPH

    in_graph = embedder.spec.model_name in FLIP_TEST_IN_GRAPH

    def network(b):
        x = resize_images(b, size)
        for view in (x,) if in_graph else (x, x[:, :, ::-1]):
            session.run(None, {input_name: embedder.spec.preprocess(np.ascontiguousarray(view))})

    result = {
        "export": str(export),
        "backbone_onnx_bytes": onnx_path.stat().st_size,
        "network_input": list(size),
        "flip_test_in_graph": in_graph,
        "network_with_flip_ms_per_face": round(_best_ms_per_face(network, crops, batch, repeat), 3),
    }
    total_bytes = onnx_path.stat().st_size
    if lbp is not None:
        from partialfc.models.lbp import LbpWccnEmbedder

        descriptor = LbpWccnEmbedder.load(lbp)  # one call: the face and, with .flip, its mirror
        cost = _best_ms_per_face(descriptor, crops, batch, repeat)
        result["descriptor"] = str(lbp)
        result["descriptor_bytes"] = lbp.stat().st_size
        result["descriptor_mirror_averaged"] = descriptor.flip
        result["descriptor_ms_per_face"] = round(cost, 3)
        result["fused_ms_per_face"] = round(cost + result["network_with_flip_ms_per_face"], 3)
        total_bytes += lbp.stat().st_size
    result["deployed_bytes"] = total_bytes
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export", required=True, help="export folder with backbone.onnx")
    parser.add_argument("--lbp", help="a fused model's descriptor (lbp_wccn.npz)")
    parser.add_argument("--faces", type=int, default=200, help="default 200")
    parser.add_argument("--batch", type=int, default=50, help="faces a call; default 50")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes; default 3")
    parser.add_argument("--threads", type=int, default=1, help="default 1")
    parser.add_argument("--out", help="JSON file to write (default: print only)")
    args = parser.parse_args(argv)
    for name in ("faces", "batch", "repeat", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    lbp = Path(args.lbp) if args.lbp else None
    if lbp is not None and not lbp.is_file():
        parser.error(f"--lbp {lbp}: no such file")
    _limit_threads(args.threads)
    try:
        measured = measure(
            Path(args.export), lbp, args.faces, args.batch, args.repeat, args.threads
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"face_embedding_cost: {err}", file=sys.stderr)
        return 2
    result = {
        "how": f"{args.faces} seeded random {CROP_SIZE}x{CROP_SIZE} uint8 faces, batches of "
        f"{args.batch}, best of {args.repeat} passes after a warm-up, {args.threads} thread(s)",
        "cpu": _cpu(),
        "threads": args.threads,
        **measured,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        from partialfc.atomic import atomic_write_bytes

        atomic_write_bytes(Path(args.out), (text + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
