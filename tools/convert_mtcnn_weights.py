"""Convert the MTCNN weights shipped in the facenet-pytorch 2.6.0 wheel to safetensors.

    pip download --no-deps facenet-pytorch==2.6.0 -d /tmp/fp
    python tools/convert_mtcnn_weights.py /tmp/fp/facenet_pytorch-2.6.0-py3-none-any.whl

Reads ``facenet_pytorch/data/{pnet,rnet,onet}.pt`` (plain state dicts, loaded with
``weights_only=True``) from the wheel, checks that they fit ``partialfc.detect.mtcnn``'s
networks exactly, and writes ``partialfc/detect/weights/mtcnn_*.safetensors`` plus the wheel's
licence text. Runtime code only ever reads the safetensors files.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from partialfc.detect.mtcnn import WEIGHTS_DIR, ONet, PNet, RNet

NETWORKS = {"pnet": PNet, "rnet": RNet, "onet": ONet}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", help="facenet_pytorch-2.6.0-py3-none-any.whl")
    parser.add_argument("--out", default=str(WEIGHTS_DIR))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(args.wheel) as wheel:
        for name, cls in NETWORKS.items():
            raw = wheel.read(f"facenet_pytorch/data/{name}.pt")
            state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
            cls().load_state_dict(state, strict=True)  # exact key and shape match
            target = out / f"mtcnn_{name}.safetensors"
            save_file({k: v.contiguous().float() for k, v in state.items()}, str(target))
            print(f"{name}.pt sha256 {hashlib.sha256(raw).hexdigest()} -> {target}")
        licence = wheel.read("facenet_pytorch-2.6.0.dist-info/LICENSE.md")
        (out / "LICENSE.facenet-pytorch.md").write_bytes(licence)


if __name__ == "__main__":
    main()
