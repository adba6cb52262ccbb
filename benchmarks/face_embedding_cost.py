"""What a face model costs to ship and to run, as JSON: file sizes and milliseconds a face.

For an export folder (``backbone.onnx`` + its preprocessing spec, as ``partialfc export`` or
the LFW recipe writes it) and, optionally, a fused model's descriptor (``lbp_wccn.npz``):

* the size of every file a deployment needs (``backbone.onnx``, the descriptor);
* milliseconds per face for the network with the flip test (the face and its mirror, two
  ONNX runs through onnxruntime; one run for a network whose graph embeds the mirror itself,
  ``partialfc.models.ltp_fused.FLIP_TEST_IN_GRAPH``), for the descriptor (one call, which
  averages the face's and its mirror's histograms when the descriptor was fitted that way) and
  for both together;
* with ``--baseline OTHER_EXPORT``, the same network timing of another export in the same
  passes (alternating with the first, so that both see the same moments of a shared machine)
  and the ratio of the two;
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


def _best_ms_per_face(fns, faces, batch: int, repeat: int) -> list[float]:
    """For each of ``fns``: best of ``repeat`` timed passes (after one warm-up pass) over
    ``faces`` in batches of ``batch``, in milliseconds per face; the passes of the functions
    alternate, so that a slower or faster moment of a shared machine falls on all of them."""
    batches = [faces[i : i + batch] for i in range(0, len(faces), batch)]
    for fn in fns:
        for b in batches:
            fn(b)
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            start = time.perf_counter()
            for b in batches:
                fn(b)
            best[k] = min(best[k], time.perf_counter() - start)
    return [1000.0 * t / len(faces) for t in best]


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


def _network_runner(export: Path, threads: int):
    """``(run(batch of crops), facts)`` for the network of an export folder, flip test
    included (two onnxruntime runs, or one for a graph that embeds the mirror itself)."""
    import numpy as np
    import onnxruntime as ort

    from partialfc.backbone.embedder import Embedder
    from partialfc.eval import resize_images
    from partialfc.models.ltp_fused import FLIP_TEST_IN_GRAPH

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
    in_graph = embedder.spec.model_name in FLIP_TEST_IN_GRAPH

    def network(b):
        x = resize_images(b, size)
        for view in (x,) if in_graph else (x, x[:, :, ::-1]):
            session.run(None, {input_name: embedder.spec.preprocess(np.ascontiguousarray(view))})

    facts = {
        "export": str(export),
        "backbone_onnx_bytes": onnx_path.stat().st_size,
        "network_input": list(size),
        "flip_test_in_graph": in_graph,
    }
    return network, facts


def measure(
    export: Path,
    lbp: Path | None,
    faces: int,
    batch: int,
    repeat: int,
    threads: int,
    baseline: Path | None = None,
):
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    network, result = _network_runner(export, threads)
    crops = np.random.default_rng(0).integers(0, 256, (faces, CROP_SIZE, CROP_SIZE), np.uint8)
    runners = [network]
    if baseline is not None:
        baseline_network, baseline_facts = _network_runner(baseline, threads)
        runners.append(baseline_network)
    costs = _best_ms_per_face(runners, crops, batch, repeat)
    result["network_with_flip_ms_per_face"] = round(costs[0], 3)
    if baseline is not None:
        result["baseline"] = {
            **baseline_facts,
            "network_with_flip_ms_per_face": round(costs[1], 3),
        }
        result["baseline_ms_over_export_ms"] = round(costs[1] / costs[0], 3)
    total_bytes = result["backbone_onnx_bytes"]
    if lbp is not None:
        from partialfc.models.lbp import LbpWccnEmbedder

        descriptor = LbpWccnEmbedder.load(lbp)  # one call: the face and, with .flip, its mirror
        (cost,) = _best_ms_per_face([descriptor], crops, batch, repeat)
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
    parser.add_argument(
        "--baseline",
        help="another export folder whose network is timed in the same passes, alternating "
        "with --export's (e.g. the same weights from another exporter): reports both and "
        "their ratio",
    )
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
            Path(args.export),
            lbp,
            args.faces,
            args.batch,
            args.repeat,
            args.threads,
            Path(args.baseline) if args.baseline else None,
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
