"""``partialfc align SRC DST``: a folder of photos -> aligned crops per identity + a report.

    partialfc align photos/ aligned/ [--size 112] [--all-faces] [--format png|jpg]

``SRC`` is ``root/<identity>/<photo>`` (crops go to ``DST/<identity>/<photo stem>.png``) or a
folder of photos (crops go to ``DST/<photo stem>.png``). Every photo is detected with MTCNN
(``--detector PACK``: the SCRFD model of an InsightFace model pack, or an SCRFD ``.onnx``); the
largest face is kept (``--all-faces``: each face, as ``<stem>_<k>``). ``DST/align_report.json``
lists photos with no face, with several faces, and unreadable ones, and each crop's source, box,
score and landmarks. Exit status 0 when at least one face was aligned, 2 otherwise.

The same options are shared by ``pack --detect`` and ``embed|verify|search --detect``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
from pathlib import Path

REPORT_FILENAME = "align_report.json"


def add_detect_arguments(parser: argparse.ArgumentParser, with_flag: bool = True) -> None:
    """``--detect`` (when ``with_flag``), ``--detector``, ``--all-faces``, ``--min-face-size``,
    ``--scrfd-size``, ``--scrfd-threshold``."""
    if with_flag:
        parser.add_argument(
            "--detect",
            action="store_true",
            help="inputs are photos: detect faces (MTCNN, or see --detector) and align them first",
        )
    parser.add_argument(
        "--detector",
        action=_DetectorAction,
        metavar="mtcnn|PACK|SCRFD.onnx",
        help="face detector: mtcnn, an InsightFace model pack folder (its SCRFD detection ONNX, "
        "e.g. buffalo_l/det_10g.onnx) or an SCRFD .onnx file"
        + (
            " (implies --detect); default: the model's own SCRFD when MODEL is a model pack "
            "folder, else mtcnn"
            if with_flag
            else "; default: mtcnn"
        ),
    )
    parser.add_argument(
        "--all-faces",
        action="store_true",
        help="with detection: keep every face (default: the largest face of each photo)",
    )
    parser.add_argument(
        "--min-face-size",
        type=float,
        default=20.0,
        help="with MTCNN: smallest face searched, in pixels (default 20)",
    )
    parser.add_argument(
        "--scrfd-size",
        type=int,
        default=640,
        help="with SCRFD: side of the square network input photos are fitted into (default "
        "640, InsightFace's det_size; a graph with fixed sides uses its own)",
    )
    parser.add_argument(
        "--scrfd-threshold",
        type=float,
        default=0.5,
        help="with SCRFD: smallest face score kept (default 0.5, InsightFace's det_thresh)",
    )


class _DetectorAction(argparse.Action):
    """``--detector X`` also sets ``--detect`` (photos are the input)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        if hasattr(namespace, "detect"):
            namespace.detect = True


def detector_from_args(args: argparse.Namespace):
    """The detector ``--detector`` names (MTCNN for ``--min-face-size``, or SCRFD for
    ``--scrfd-size``/``--scrfd-threshold``) [on ``--device``], built once per process.

    No ``--detector``: the SCRFD model of ``args.model`` when that is an InsightFace model pack
    folder, else MTCNN.
    """
    device = getattr(args, "device", None) or "cpu"
    choice = getattr(args, "detector", None)
    if choice is None:
        model = getattr(args, "model", None)
        choice = model if isinstance(model, str) and _pack_detector(model) else "mtcnn"
    if choice == "mtcnn":
        return _detector(device, float(args.min_face_size))
    size = int(getattr(args, "scrfd_size", 640))
    if size < 32:
        raise ValueError(f"--scrfd-size must be at least 32 pixels, got {size}")
    threshold = float(getattr(args, "scrfd_threshold", 0.5))
    if not 0 <= threshold <= 1:
        raise ValueError(f"--scrfd-threshold must be in [0, 1], got {threshold}")
    return _scrfd(str(choice), device, size, threshold)


def _pack_detector(model: str) -> bool:
    """Whether ``model`` is a folder holding an SCRFD detection ONNX."""
    from partialfc.detect.scrfd import find_scrfd_onnx

    folder = Path(model)
    if not folder.is_dir() or not any(folder.glob("*.onnx")):
        return False
    try:
        find_scrfd_onnx(folder)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4)
def _detector(device: str, min_face_size: float):
    from partialfc.detect import load_detector

    return load_detector("mtcnn", device=device, min_face_size=min_face_size)


@functools.lru_cache(maxsize=4)
def _scrfd(path: str, device: str, size: int, threshold: float):
    from partialfc.detect import load_detector

    detector = load_detector(
        "scrfd", device=device, path=path, input_size=(size, size), score_threshold=threshold
    )
    print(f"face detector: SCRFD {detector.path}", file=sys.stderr)
    return detector


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    parser.add_argument("source", help="photo folder: root/<identity>/<photo>, or photos")
    parser.add_argument("output", help="output folder for the aligned crops (new or empty)")
    parser.add_argument("--size", type=int, default=112, help="crop side in pixels (default 112)")
    parser.add_argument("--format", choices=("png", "jpg"), default="png", help="crop format")
    parser.add_argument("--skip-bad", action="store_true", help="list unreadable photos, go on")
    add_detect_arguments(parser, with_flag=False)


def align_folder(
    source: str | Path,
    output: str | Path,
    detector,
    size: int = 112,
    all_faces: bool = False,
    fmt: str = "png",
    skip_bad: bool = False,
    progress: bool = True,
) -> dict:
    """Write aligned crops of the photos under ``source`` to ``output``; returns the report."""
    from partialfc.atomic import atomic_write_bytes
    from partialfc.data.decode import encode_image
    from partialfc.detect.photos import align_photos, photo_list

    source, output = Path(source), Path(output)
    if not source.is_dir():
        raise ValueError(f"{source}: photo folder not found")
    if output.exists() and any(output.iterdir()):
        raise ValueError(f"{output}: output folder exists and is not empty")
    paths, labels, names = photo_list(source)
    per_identity = any(d.is_dir() for d in source.iterdir())
    photos = align_photos(
        paths,
        labels,
        detector,
        size=size,
        all_faces=all_faces,
        skip_unreadable=skip_bad,
        progress="align" if progress else None,
    )
    rows, seen = [], {}
    for i, (path, label, face) in enumerate(
        zip(photos.sources, photos.labels, photos.faces, strict=True)
    ):
        folder = output / names[label] if per_identity else output
        k = seen.get(path, 0)
        seen[path] = k + 1
        several = all_faces and photos.several_faces.get(path, 1) > 1
        stem = Path(path).stem + (f"_{k}" if several else "")
        target = folder / f"{stem}.{fmt}"
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, encode_image(photos.crops[i], f".{fmt}"))
        rows.append({"source": path, "output": str(target), **face.to_dict()})
    report = {"photos": len(paths), "size": size, **photos.summary(), "crops": rows}
    output.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(output / REPORT_FILENAME, (json.dumps(report, indent=2) + "\n").encode())
    return report


def run(args: argparse.Namespace) -> int:
    try:
        report = align_folder(
            args.source,
            args.output,
            detector_from_args(args),
            size=args.size,
            all_faces=args.all_faces,
            fmt=args.format,
            skip_bad=args.skip_bad,
        )
    except (ValueError, FileNotFoundError) as err:
        print(f"partialfc align: {err}", file=sys.stderr)
        return 2
    summary = {k: v for k, v in report.items() if k != "crops"}
    summary["report"] = str(Path(args.output) / REPORT_FILENAME)
    print(json.dumps(summary))
    if report["no_face"]:
        print(
            f"partialfc align: no face found in {len(report['no_face'])} photo(s)", file=sys.stderr
        )
    if report["faces"] == 0:
        print("partialfc align: no face aligned", file=sys.stderr)
        return 2
    return 0


@contextlib.contextmanager
def aligned_copy(source: str | Path, args: argparse.Namespace, size: int = 112):
    """``pack --detect``: align the photos under ``source`` into a temporary folder.

    Yields ``(folder, summary)``; the summary lists photos with no face or several faces.
    """
    source = Path(source)
    if not source.is_dir():
        raise ValueError(f"{source}: --detect needs a photo folder (root/<identity>/<photo>)")
    with tempfile.TemporaryDirectory(prefix="partialfc-align-") as tmp:
        report = align_folder(
            source,
            Path(tmp) / "aligned",
            detector_from_args(args),
            size=size,
            all_faces=args.all_faces,
            skip_bad=getattr(args, "skip_bad", False),
        )
        if report["faces"] == 0:
            raise ValueError(f"{source}: no face found in any of {report['photos']} photo(s)")
        summary = {k: report[k] for k in ("photos", "faces", "no_face", "several_faces")}
        yield Path(tmp) / "aligned", summary
