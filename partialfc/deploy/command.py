"""``partialfc export | embed | verify | search``.

    partialfc export RUN_OR_CHECKPOINT OUT_DIR
    partialfc embed MODEL INPUT --out embeddings.npz [--flip]
    partialfc verify MODEL --calibrate INPUT --far 1e-3 --save-threshold t.json --pair A.png B.png
    partialfc verify MODEL --threshold t.json --pairs pairs.txt   # [--allow-other-model]
    partialfc search MODEL GALLERY.npz --enroll INPUT          # one identity per label
    partialfc search MODEL GALLERY.npz --query INPUT [--top-k 5] [--threshold t.json]

``MODEL`` is anything ``Embedder.load`` accepts (exported dir, .onnx, training run or
checkpoint, InsightFace model pack folder; ``--preprocessing insightface`` for a model-zoo
ONNX). With a model pack, ``--detect`` uses the pack's SCRFD detector. ``INPUT`` is a folder
of aligned faces (``root/<identity>/<image>``), a RecordIO ``.rec`` set, or (for queries and
pairs) single image files. With ``--detect`` inputs are photos (a file, a folder of photos or
``root/<identity>/<photo>``): the largest face of each (``--all-faces``: every face) is
detected and aligned to the model's input first. A ``--threshold`` file calibrated on other
weights (its ``model_sha256`` differs from ``Embedder.model_sha256``) is an error unless
``--allow-other-model``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from partialfc.backbone.embedding import l2_normalize
from partialfc.deploy.verify import check_finite_rows
from partialfc.ranges import Range, check_options

OPTION_RANGES = {
    "--batch-size": Range(1, integer=True),
    "--top-k": Range(1, integer=True),
    "--far": Range(0, 1, low_open=True, high_open=True),
    "--opset": Range(7, 100, integer=True),
    "--lock-timeout": Range(0),
}


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    if command == "export":
        parser.add_argument("checkpoint", help="training checkpoint directory or run folder")
        parser.add_argument("out_dir", help="directory for backbone.onnx/.safetensors + spec")
        parser.add_argument(
            "--opset", type=int, default=18, help="ONNX opset, 11 or later (default 18)"
        )
        parser.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
        parser.add_argument(
            "--weights",
            choices=("auto", "ema", "raw"),
            default="auto",
            help="auto (default): the EMA weights when the run kept them (train.ema_decay), "
            "else the trained ones; ema; raw (the trained weights)",
        )
        return
    parser.add_argument(
        "model",
        help="exported dir, .onnx file, training checkpoint/run, or InsightFace model pack folder",
    )
    parser.add_argument(
        "--backend",
        choices=("auto", "torch", "onnx"),
        default="auto",
        help="auto/torch: PyTorch weights (onnxruntime for a bare .onnx file); onnx: the "
        "exported directory's backbone.onnx with onnxruntime",
    )
    add_preprocessing_argument(parser)
    parser.add_argument("--flip", action="store_true", help="flip test: f(x) + f(mirror(x))")
    parser.add_argument("--batch-size", type=int, default=256, help="images per forward pass")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    from partialfc.detect.command import add_detect_arguments

    add_detect_arguments(parser)  # --detect: inputs are photos, faces are detected and aligned
    if command == "embed":
        parser.add_argument("input", help="image folder or .rec set")
        parser.add_argument("--out", required=True, help="output .npz")
        _add_skip_bad(parser, "beside --out: OUT.refused.tsv")
    elif command == "verify":
        parser.add_argument("--pair", nargs=2, metavar=("IMAGE_A", "IMAGE_B"), help="one pair")
        parser.add_argument("--pairs", help="text file: 'path_a path_b' per line")
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--threshold", help="calibrated threshold JSON")
        group.add_argument("--calibrate", help="image folder / .rec of labelled impostors")
        parser.add_argument("--far", type=float, default=1e-3, help="target FAR (calibration)")
        parser.add_argument("--save-threshold", help="write the calibrated threshold here")
        _add_allow_other_model(parser)
    elif command == "search":
        parser.add_argument("gallery", help="gallery .npz (created on first --enroll)")
        parser.add_argument("--enroll", help="image folder / .rec: one template per identity")
        parser.add_argument("--remove", nargs="+", default=[], help="identities to remove")
        parser.add_argument("--query", help="image file, image folder or .rec to search")
        parser.add_argument("--top-k", type=int, default=5, help="matches listed per query")
        parser.add_argument("--threshold", help="calibrated threshold JSON: open-set decision")
        _add_skip_bad(parser, "beside the gallery: GALLERY.refused.tsv")
        parser.add_argument(
            "--lock-timeout",
            type=float,
            default=None,
            metavar="SECONDS",
            help="when enrolling or removing: how long to wait while another process updates "
            "the same gallery (default: as long as it takes)",
        )
        _add_allow_other_model(parser)
    else:
        raise ValueError(f"unknown deploy command {command!r}")


def add_preprocessing_argument(parser: argparse.ArgumentParser) -> None:
    """``--preprocessing auto|stored|insightface`` (see ``partialfc.backbone.embedder``)."""
    from partialfc.backbone.embedder import PREPROCESSING, PREPROCESSING_HELP

    parser.add_argument(
        "--preprocessing",
        choices=PREPROCESSING,
        default="auto",
        help=PREPROCESSING_HELP,
    )


def _add_skip_bad(parser: argparse.ArgumentParser, where: str) -> None:
    parser.add_argument(
        "--skip-bad",
        action="store_true",
        help="embed the images that can be read and list the others (file and reason, tab "
        f"separated) {where}; default: stop at the first unreadable image",
    )


def _add_allow_other_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-other-model",
        action="store_true",
        help="use a --threshold file calibrated on other weights (its model hash differs)",
    )


# ---------------------------------------------------------------------- inputs
def open_labelled_set(path: str | Path, grayscale: bool):
    """``(dataset, identity names per label)`` for an image folder or a ``.rec`` set (names from
    its ``.names.json`` sidecar when ``pack`` wrote one, else the labels)."""
    from partialfc.data import RecordIODataset, read_identity_names
    from partialfc.data.datasets import FileListDataset, scan_labelled_images

    path = Path(path)
    if path.suffix == ".rec":
        dataset = RecordIODataset(path, grayscale=grayscale)
        names = read_identity_names(path)
        if names is None or len(names) != dataset.num_classes:
            names = [str(i) for i in range(dataset.num_classes)]
        return dataset, names
    if path.is_dir():
        paths, labels, names = scan_labelled_images(path)
        return FileListDataset(paths, labels, grayscale=grayscale), names
    raise ValueError(
        f"{path}: expected an image folder (root/<identity>/<image>, or images) or a .rec file"
    )


def _hwc(image) -> np.ndarray:
    a = image.numpy()
    return a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)


def describe_rows(dataset, names):
    """``i -> "<image file or record>, identity <name>"`` for error messages."""
    paths, keys = getattr(dataset, "paths", None), getattr(dataset, "keys", None)
    labels = dataset.labels

    def describe(i: int) -> str:
        if paths is not None:
            where = str(paths[i])
        elif keys is not None:
            where = f"record id {int(keys[i])}"
        else:
            where = f"image {i}"
        return f"{where}, identity {names[int(labels[i])]}"

    return describe


def embed_dataset(
    embedder, dataset, flip: bool, batch_size: int, desc: str, refused: list | None = None
) -> np.ndarray:
    """Raw (unnormalised) embeddings ``(N, d)`` of every image, with a progress bar.

    With a ``refused`` list, an image that cannot be read (ValueError: unreadable, not an
    image, header above the pixel limit, damaged record) is left out and ``(row, message)``
    appended to the list instead; the rows embedded are the others, in order."""
    out = []
    with tqdm(total=len(dataset), desc=desc, unit="img", file=sys.stderr) as bar:
        for start in range(0, len(dataset), batch_size):
            stop = min(start + batch_size, len(dataset))
            images = []
            for i in range(start, stop):
                try:
                    images.append(_hwc(dataset[i][0]))
                except ValueError as err:
                    if refused is None:
                        raise
                    refused.append((i, str(err)))
            if images:
                out.append(embedder.embed_raw(np.stack(images), flip=flip, batch_size=batch_size))
            bar.update(stop - start)
    if not out:
        raise ValueError(f"none of the {len(dataset)} images could be read")
    return np.concatenate(out)


def read_images(paths: list[str], grayscale: bool) -> np.ndarray:
    from partialfc.data import decode_image
    from partialfc.data.datasets import read_file

    images = []
    for p in paths:
        try:
            images.append(decode_image(read_file(p), p, grayscale=grayscale))
        except OSError as err:
            raise ValueError(f"{p}: cannot read image: {err}") from None
    return np.stack(images)


def _sources(dataset, path) -> np.ndarray:
    """Source of every row: the image path, or ``<file.rec>#<index>`` for a RecordIO set."""
    paths = getattr(dataset, "paths", None)
    if paths is not None:
        return np.asarray(list(paths), dtype=str)
    return np.asarray([f"{path}#{i}" for i in range(len(dataset))], dtype=str)


@dataclass
class Labelled:
    """Raw embeddings of a labelled set or of photos, and what was refused (``--skip-bad``)."""

    raw: np.ndarray  # (N, d) unnormalised
    labels: np.ndarray  # (N,) label of each row
    names: list[str]  # identity name per label
    sources: list[str]  # image (or record, or photo) of each row
    provenance: dict  # per-row arrays for an .npz
    refused: list[tuple[str, str]]  # (file, reason) of each image left out


def _embed_labelled(embedder, path, args, desc: str) -> Labelled:
    """Embeddings of a labelled set (folder or ``.rec``) or, with ``--detect``, of photos; with
    ``--skip-bad`` unreadable images are left out and listed instead of stopping the run."""
    from partialfc.data.refused import reason_of

    skip = getattr(args, "skip_bad", False)
    if getattr(args, "detect", False):
        from partialfc.detect.deploy import embed_photos

        rows = embed_photos(embedder, path, args, desc)
        check_finite_rows(rows.raw, str(path), lambda i: rows.sources[i])
        refused = [(p, reason_of(p, m)) for p, m in rows.photos.unreadable.items()]
        return Labelled(rows.raw, rows.labels, rows.names, rows.sources, rows.arrays(), refused)
    dataset, names = open_labelled_set(path, embedder.spec.in_channels == 1)
    refused_rows: list | None = [] if skip else None
    raw = embed_dataset(embedder, dataset, args.flip, args.batch_size, desc, refused_rows)
    every_source = _sources(dataset, path)
    left_out = {i for i, _ in refused_rows or []}
    kept = np.asarray([i for i in range(len(dataset)) if i not in left_out], dtype=np.int64)
    describe = describe_rows(dataset, names)
    check_finite_rows(raw, str(path), lambda i: describe(int(kept[i])))
    sources = every_source[kept]
    refused = [
        (str(every_source[i]), reason_of(str(every_source[i]), m)) for i, m in refused_rows or []
    ]
    labels = np.asarray(dataset.labels)[kept]
    return Labelled(raw, labels, names, list(sources), {"sources": sources}, refused)


def write_refused(output: str | Path, refused: list[tuple[str, str]], command: str) -> Path:
    """``--skip-bad``: list the refused files beside ``output`` and say how many on stderr."""
    from partialfc.data.refused import refused_list_path, write_refused_list

    path = write_refused_list(refused_list_path(output), refused)
    if refused:
        print(
            f"partialfc {command}: {len(refused)} file(s) refused and left out, listed in {path}",
            file=sys.stderr,
        )
    return path


def _atomic_savez(path: Path, **arrays) -> None:
    from partialfc.atomic import atomic_write_bytes

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


# ---------------------------------------------------------------------- commands
def run(args: argparse.Namespace) -> int:
    try:
        check_options(args, OPTION_RANGES)
        jobs = {"export": _export, "embed": _embed, "verify": _verify, "search": _search}
        jobs["gallery"] = _search  # partialfc gallery enroll|remove|query (gallery_command)
        return jobs[args.command](args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"partialfc {args.command}: {message}", file=sys.stderr)
        return 2


def _export(args) -> int:
    from partialfc.backbone.io import checkpoint_weights_file, newest_checkpoint
    from partialfc.deploy.export import export_checkpoint

    found = newest_checkpoint(args.checkpoint)
    if found is not None:
        chosen = checkpoint_weights_file(found, args.weights)
        print(f"exporting {found / chosen}", file=sys.stderr)
    result = export_checkpoint(
        args.checkpoint,
        args.out_dir,
        weights=args.weights,
        opset=args.opset,
        check=not args.no_check,
    )
    print(json.dumps(result.to_dict(), indent=2))
    if result.max_abs_diff is not None:
        print(f"onnxruntime vs PyTorch: max |diff| = {result.max_abs_diff:.3g}", file=sys.stderr)
    return 0


def _load(args):
    from partialfc.backbone.embedder import Embedder

    embedder = Embedder.load(
        args.model, backend=args.backend, device=args.device, preprocessing=args.preprocessing
    )
    note_preprocessing(f"partialfc {args.command}", embedder)
    return embedder


def note_preprocessing(prefix: str, embedder) -> None:
    """Say on stderr which file runs and with what, when InsightFace's rule was applied."""
    if getattr(embedder, "preprocessing_source", "stored") != "insightface":
        return
    spec = embedder.spec
    pixels = (
        "raw 0-255 pixels (the graph normalises itself)"
        if spec.mean[0] == 0
        else "(x - 127.5) / 127.5"
    )
    h, w = spec.input_size
    print(
        f"{prefix}: {embedder.backend.path}: InsightFace preprocessing: {h}x{w} aligned RGB "
        f"crops, {pixels}",
        file=sys.stderr,
    )


def _embed(args) -> int:
    embedder = _load(args)
    rows = _embed_labelled(embedder, args.input, args, "embed")
    raw = rows.raw
    _atomic_savez(
        Path(args.out),
        embeddings=l2_normalize(raw).astype(np.float32),
        norms=np.linalg.norm(raw, axis=1).astype(np.float32),
        labels=np.asarray(rows.labels, dtype=np.int64),
        identity_names=np.asarray(rows.names, dtype=str),
        **rows.provenance,
    )
    summary = f"{len(raw)} embeddings of dim {raw.shape[1]} written to {args.out}"
    if args.skip_bad:
        listed = write_refused(args.out, rows.refused, "embed")
        summary += f"; {len(rows.refused)} file(s) refused, listed in {listed}"
    print(summary)
    return 0


def load_threshold_for(args, embedder):
    """``args.threshold`` loaded and checked against the embedder's weights (a mismatch is an
    error unless ``--allow-other-model``; an unverifiable file is a warning on stderr)."""
    from partialfc.deploy.verify import CalibratedThreshold, check_threshold_model

    threshold = CalibratedThreshold.load(args.threshold)
    warning = check_threshold_model(
        threshold,
        embedder.model_sha256,
        threshold_name=str(args.threshold),
        model_name=str(args.model),
        allow_other_model=args.allow_other_model,
    )
    if warning:
        print(f"partialfc {args.command}: warning: {warning}", file=sys.stderr)
    return threshold


def _threshold(args, embedder):
    from partialfc.deploy.verify import calibrate
    from partialfc.eval.intervals import percent

    if args.threshold:
        return load_threshold_for(args, embedder)
    rows = _embed_labelled(embedder, args.calibrate, args, "calibrate")
    t = calibrate(
        l2_normalize(rows.raw),
        rows.labels,
        args.far,
        source=args.calibrate,
        model_sha256=embedder.model_sha256,
    )
    low, high = t.far_interval_95
    print(
        f"threshold {t.threshold:.4f} at FAR {t.target_far:g}: {t.false_accepts} of "
        f"{t.n_impostor} calibration impostors accepted (95% CI {percent(low)} to {percent(high)})",
        file=sys.stderr,
    )
    if args.save_threshold:
        t.save(args.save_threshold)
    return t


def _verify(args) -> int:
    from partialfc.deploy.verify import decide

    if args.threshold and not (args.pair or args.pairs):
        raise ValueError("--threshold needs pairs to score: give --pair A B or --pairs FILE")
    embedder = _load(args)
    threshold = _threshold(args, embedder)
    if args.pairs:
        lines = [ln.split() for ln in Path(args.pairs).read_text().splitlines() if ln.strip()]
        bad = [i + 1 for i, parts in enumerate(lines) if len(parts) != 2]
        if bad:
            raise ValueError(f"{args.pairs}: line {bad[0]}: expected 'path_a path_b'")
        pairs = [tuple(parts) for parts in lines]
    elif args.pair:
        pairs = [tuple(args.pair)]
    else:
        return 0  # calibration only
    grey = embedder.spec.in_channels == 1
    if args.detect:
        from partialfc.detect.deploy import read_aligned_faces

        def load(paths):
            return read_aligned_faces(embedder, paths, args)
    else:

        def load(paths):
            return read_images(paths, grey)

    for start in tqdm(range(0, len(pairs), args.batch_size), desc="verify", file=sys.stderr):
        chunk = pairs[start : start + args.batch_size]
        a = embedder.embed(load([p for p, _ in chunk]), flip=args.flip)
        b = embedder.embed(load([q for _, q in chunk]), flip=args.flip)
        for side, e in ((0, a), (1, b)):
            check_finite_rows(e, args.pairs or "--pair", _pair_image(chunk, start, side))
        result = decide(a, b, threshold)
        for (p, q), s, ok in zip(chunk, result.score, result.accept, strict=True):
            row = {"a": p, "b": q, "score": round(float(s), 6), "match": bool(ok)}
            print(json.dumps(row, allow_nan=False))
    return 0


def _pair_image(chunk, start: int, side: int):
    return lambda i: f"{chunk[i][side]}, pair {start + i + 1}"


def _box(box) -> list[float]:
    return [round(float(v), 1) for v in box]


def _search(args) -> int:
    from partialfc.deploy.gallery import Gallery

    if not (args.enroll or args.remove or args.query):
        raise ValueError("nothing to do: give --enroll, --query and/or --remove")
    embedder = _load(args)
    threshold = load_threshold_for(args, embedder) if args.threshold else None
    path = Path(args.gallery)
    if path.exists():  # fail before embedding anything; checked again under the lock
        found = Gallery.open(path).dim
        if found != embedder.embedding_dim:
            raise ValueError(f"{path}: gallery dim {found} != model's {embedder.embedding_dim}")
    grey = embedder.spec.in_channels == 1
    gallery, refused = None, []
    if args.enroll or args.remove:
        if args.enroll:  # embedded before the lock is taken: the lock is held only to update
            enrolment = _embed_labelled(embedder, args.enroll, args, "enroll")
            refused += enrolment.refused
            raw, labels, names = enrolment.raw, enrolment.labels, enrolment.names
        with Gallery.updating(
            path, embedder.embedding_dim, args.model, lock_timeout=args.lock_timeout
        ) as gallery:
            for name in args.remove:
                gallery.remove(name)
            if args.enroll:
                for label in np.unique(labels):
                    gallery.enroll(names[label], raw[labels == label])
        print(f"{path}: {len(gallery)} identities", file=sys.stderr)
    if args.query:
        query, boxes = Path(args.query), None
        if args.detect:
            from partialfc.detect.deploy import embed_photos

            rows = embed_photos(embedder, query, args, "query")
            sources, raw, boxes = rows.sources, rows.raw, rows.photos.boxes()
            from partialfc.data.refused import reason_of

            refused += [(p, reason_of(p, m)) for p, m in rows.photos.unreadable.items()]
        elif query.is_file() and query.suffix != ".rec":
            images = read_images([str(query)], grey)
            sources, raw = [str(query)], embedder.embed_raw(images, flip=args.flip)
        else:
            queries = _embed_labelled(embedder, query, args, "query")
            raw, sources, refused = queries.raw, queries.sources, refused + queries.refused
        check_finite_rows(raw, str(query), lambda i: sources[i])
        if gallery is None:
            gallery = Gallery.open(path)
        result = gallery.search(raw, k=args.top_k)
        for n, (src, ids, scores) in enumerate(
            zip(sources, result.identities, result.scores, strict=True)
        ):
            row = {"query": src} if boxes is None else {"query": src, "box": _box(boxes[n])}
            row |= {
                "matches": [
                    {"identity": i, "score": round(float(s), 6)}
                    for i, s in zip(ids, scores, strict=True)
                    if i is not None
                ],
            }
            if threshold is not None:
                top = row["matches"][0] if row["matches"] else None
                hit = top is not None and top["score"] >= threshold.threshold
                row["accepted"] = top["identity"] if hit else None
            print(json.dumps(row, allow_nan=False))
    if args.skip_bad:
        write_refused(path, refused, "search")
    return 0
