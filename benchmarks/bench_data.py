"""Decode throughput per core: RecordIO and image folders vs the bare JPEG decode limit.

Builds 112x112 JPEGs (quality 95) from the real LFW colour images in ../shared/data, writes them
as an image folder and as a packed ``.rec`` in a temporary directory, then measures on one core
(one process, one thread):

* limit: ``cv2.imdecode`` of the JPEG bytes already in memory (nothing else);
* recordio: ``RecordIODataset[i]`` in random order (pread + IRHeader + decode to RGB +
  tensor), collated into uint8 batches of ``--batch-size`` as a DataLoader worker does, with
  ``collate_images`` (channels-last batch) and with torch's ``default_collate`` (NCHW copy);
* image_folder: ``ImageFolderDataset[i]`` likewise (open/read + decode + tensor + collate).

Prints JSON; ``fraction_of_limit`` = rate / limit (target >= 0.8); best of ``--repeats``
interleaved rounds.

    python benchmarks/bench_data.py [--images 2000] [--repeats 5] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import zipfile
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import default_collate

from partialfc.data import ImageFolderDataset, RecordIODataset
from partialfc.data.decode import decode_image, encode_image
from partialfc.data.loaders import shared_data_root
from partialfc.data.pack import pack_images
from partialfc.data.transforms import collate_images


def make_jpegs(root: Path, count: int, size: int, quality: int) -> list[bytes]:
    archive = zipfile.ZipFile(shared_data_root() / "lfw_dev" / "lfw_color150_dev.zip")
    names = sorted(n for n in archive.namelist() if n.endswith(".jpg"))[:count]
    blobs = []
    for name in names:
        image = decode_image(archive.read(name), name)
        image = cv2.resize(image, (size, size), interpolation=cv2.INTER_AREA)
        blob = encode_image(image, ".jpg", quality)
        person = name.split("/")[-2]
        (root / person).mkdir(parents=True, exist_ok=True)
        (root / person / Path(name).name).write_bytes(blob)
        blobs.append(blob)
    return blobs


def best_rates(fns: dict, count: int, repeats: int) -> dict[str, float]:
    """Best rate (images per CPU second) of each function over ``repeats`` interleaved rounds.
    CPU time rather than wall time, and interleaving, keep a shared machine's background load
    out of the comparison."""
    best = dict.fromkeys(fns, 0.0)
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.process_time()  # CPU time of this single-threaded process
            fn()
            best[name] = max(best[name], count / (time.process_time() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--quality", type=int, default=95)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder_root = Path(tmp) / "folder"
        make_jpegs(folder_root, args.images, args.size, args.quality)
        folder = ImageFolderDataset(folder_root)
        pack_images(folder.paths, folder.labels, Path(tmp) / "train.rec", progress=False)
        rec = RecordIODataset(Path(tmp) / "train.rec")
        count = len(folder)
        order = np.random.default_rng(0).permutation(count).tolist()
        in_memory = [Path(p).read_bytes() for p in folder.paths]
        buffers = [np.frombuffer(b, np.uint8) for b in in_memory]

        def bare():
            for buf in buffers:
                cv2.imdecode(buf, cv2.IMREAD_COLOR)

        def read_all(dataset, collate):
            def run():  # what a DataLoader worker does: items, then collate into a batch
                for start in range(0, count, args.batch_size):
                    collate([dataset[i] for i in order[start : start + args.batch_size]])

            return run

        variants = {"limit": bare}
        for name, dataset in (("recordio", rec), ("image_folder", folder)):
            variants[name] = read_all(dataset, collate_images)
            variants[f"{name}_default_collate"] = read_all(dataset, default_collate)
        rates = best_rates(variants, count, args.repeats)
    limit = rates.pop("limit")
    result = {
        "benchmark": "decoded images per second per core",
        "images": count,
        "image_size": args.size,
        "jpeg_quality": args.quality,
        "batch_size": args.batch_size,
        "opencv": cv2.__version__,
        "mean_jpeg_bytes": float(np.mean([len(b) for b in in_memory])),
        "limit_bare_cv2_imdecode_per_s": round(limit, 1),
        **{
            name: {
                "images_per_s_per_core": round(rate, 1),
                "fraction_of_limit": round(rate / limit, 3),
            }
            for name, rate in rates.items()
        },
        "target_fraction": 0.8,
        "timing": "process CPU time, 1 torch thread, 1 OpenCV thread",
        "machine": platform.machine(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
