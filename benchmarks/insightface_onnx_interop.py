"""partialfc against InsightFace's own classes on the same ONNX files and the same images.

Runs partialfc here and InsightFace (``insightface`` pip package: ``ArcFaceONNX``, ``SCRFD``,
``face_align.norm_crop``) in a separate interpreter given by ``--insightface-python`` (a virtual
environment with ``insightface onnxruntime opencv-python-headless``; InsightFace is never a
dependency of partialfc). No weights are downloaded: the ONNX files are built here.

* **recognition**: an ``iresnet_small`` of random weights exported to ONNX and stripped of
  partialfc's metadata (an InsightFace-style file: no preprocessing stated), and a graph that
  normalises its own input (MXNet-style ``_minus``/``_mul`` nodes); partialfc's
  ``Embedder.load(path)`` (InsightFace's rule recognised from the graph) on RGB crops against
  ``ArcFaceONNX.get_feat`` on the same crops as BGR: max |delta| of the raw features and min
  cosine, over LFW faces aligned to 112x112 (MTCNN landmarks);
* **alignment**: ``partialfc.data.align.align_face`` against ``face_align.norm_crop`` on the same
  landmarks: max |delta| in pixel values;
* **detection**: an SCRFD-shaped graph of random convolutions (strides 8/16/32, two anchors,
  keypoints; free input size) and the red-channel graph of the tests: partialfc's ``SCRFD``
  against InsightFace's ``SCRFD.detect(input_size=(640, 640))`` on LFW photos, a two-face
  collage and ORL photos: same count per image, max |delta| of boxes, keypoints and scores;
* **model pack**: a folder with the random SCRFD as ``det_10g.onnx``, the bare ``iresnet_small``
  as ``w600k_r50.onnx`` and two graphs both sides ignore, through partialfc (detector and
  embedder from the folder, every face aligned) and InsightFace's ``FaceAnalysis``: same faces,
  max |delta| of keypoints and raw embeddings, min cosine.

    python benchmarks/insightface_onnx_interop.py \
        --insightface-python /work/venv-insightface/bin/python [--shared ../shared/data] \
        [--faces 128] [--out benchmarks/results/insightface_onnx_interop.json]
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import torch
from PIL import Image
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INSIGHTFACE_SIDE = r"""
import json, sys
from pathlib import Path
import numpy as np
import insightface
from insightface.model_zoo.arcface_onnx import ArcFaceONNX
from insightface.model_zoo.scrfd import SCRFD
from insightface.utils import face_align

work = Path(sys.argv[1])
task = json.loads((work / "task.json").read_text())
crops = np.load(work / "crops_rgb.npy")
bgr = [np.ascontiguousarray(c[..., ::-1]) for c in crops]
for name in task["recognition"]:
    model = ArcFaceONNX(model_file=str(work / name))
    np.save(work / f"{name}.feat.npy", model.get_feat(bgr))
    np.save(work / f"{name}.mean_std.npy", np.array([model.input_mean, model.input_std]))
photos = np.load(work / "photos_rgb.npy", allow_pickle=False)
landmarks = np.load(work / "landmarks.npy")
aligned = [face_align.norm_crop(photos[i][..., ::-1].copy(), landmarks[i], 112)[..., ::-1]
           for i in range(len(landmarks))]
np.save(work / "norm_crop_rgb.npy", np.stack(aligned))
detection_photos = [np.load(work / f"det_photo_{k}.npy") for k in range(task["detection_photos"])]
for name in task["detection"]:
    detector = SCRFD(model_file=str(work / name))
    detector.prepare(-1, input_size=(640, 640))
    for k, rgb in enumerate(detection_photos):
        det, kps = detector.detect(np.ascontiguousarray(rgb[..., ::-1]), input_size=(640, 640))
        np.save(work / f"{name}.{k}.det.npy", det)
        np.save(work / f"{name}.{k}.kps.npy", kps)
from insightface.app import FaceAnalysis

app = FaceAnalysis(name="pack", root=str(work), allowed_modules=["detection", "recognition"],
                   providers=["CPUExecutionProvider"])
app.prepare(ctx_id=-1, det_size=(640, 640))
for k, rgb in enumerate(detection_photos):
    faces = app.get(np.ascontiguousarray(rgb[..., ::-1]))
    emb = [f.embedding for f in faces]
    np.save(work / f"pack.{k}.emb.npy", np.array(emb) if emb else np.zeros((0, 1)))
    np.save(work / f"pack.{k}.kps.npy", np.array([f.kps for f in faces]).reshape(len(faces), 5, 2))
print(json.dumps({"insightface": insightface.__version__}))
"""


class RandomSCRFD(nn.Module):
    """SCRFD's output layout from random convolutions: per stride ``s`` an ``s x s`` stride-``s``
    convolution gives two anchors x (score, 4 distances, 10 keypoint offsets) per cell."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.heads = nn.ModuleList(nn.Conv2d(3, 30, s, stride=s) for s in (8, 16, 32))
        for head in self.heads:
            nn.init.normal_(head.weight, std=0.02)
            nn.init.constant_(head.bias, 0.0)

    def forward(self, x):
        scores, boxes, points = [], [], []
        for head in self.heads:
            y = head(x).permute(0, 2, 3, 1).reshape(-1, 15)
            scores.append(torch.sigmoid(4 * y[:, :1] - 3))
            boxes.append(torch.relu(y[:, 1:5]) + 1.0)
            points.append(y[:, 5:15])
        return (*scores, *boxes, *points)


def export_random_scrfd(path: Path) -> None:
    names = [f"{kind}{s}" for kind in ("score", "bbox", "kps") for s in (8, 16, 32)]
    torch.onnx.export(
        RandomSCRFD().eval(),
        (torch.zeros(1, 3, 640, 640),),
        str(path),
        input_names=["input.1"],
        output_names=names,
        dynamic_axes={"input.1": {2: "height", 3: "width"}} | {n: {0: f"K_{n}"} for n in names},
        opset_version=13,
        dynamo=False,
    )


def export_bare_iresnet(path: Path) -> None:
    """A random ``iresnet_small`` exported by partialfc, then stripped of the metadata that
    states its preprocessing (as an InsightFace model-zoo file comes)."""
    from partialfc.backbone.spec import PreprocessingSpec
    from partialfc.deploy.export import save_onnx
    from partialfc.models import build_model

    config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 128, "input_size": 112}}
    torch.manual_seed(0)
    model = build_model(config["name"], **config["kwargs"]).eval()
    save_onnx(model, PreprocessingSpec.from_model_config(config), path)
    proto = onnx.load(str(path))
    del proto.metadata_props[:]
    onnx.save(proto, str(path))


def lfw_photos(shared: Path, count: int) -> list[np.ndarray]:
    with zipfile.ZipFile(shared / "lfw_dev" / "lfw_color150_dev.zip") as z:
        names = sorted(n for n in z.namelist() if n.endswith(".jpg"))
        step = max(1, len(names) // count)
        return [
            np.asarray(Image.open(io.BytesIO(z.read(n))).convert("RGB"))
            for n in names[::step][:count]
        ]


def orl_photos(shared: Path, count: int) -> list[np.ndarray]:
    from partialfc.data.loaders import load_orl

    images = load_orl(shared / "orl_faces").images[:: 400 // count][:count]
    return [np.repeat(np.asarray(image)[..., None], 3, axis=2) for image in images]


def compare_pack(pack: Path, work: Path, photos: list[np.ndarray]) -> dict:
    """partialfc with the pack folder as detector and embedder (every face of each photo,
    aligned, raw embeddings) against InsightFace's ``FaceAnalysis`` on the same folder."""
    from partialfc.backbone.embedder import Embedder
    from partialfc.detect import detect_and_align, load_detector

    detector = load_detector("scrfd", path=str(pack))
    embedder = Embedder.load(pack)
    counts, same, emb_d, kps_d, cosines = ([], []), True, 0.0, 0.0, []
    for k, image in enumerate(photos):
        faces = detect_and_align(image, detector, all_faces=True)
        theirs = np.load(work / f"pack.{k}.emb.npy")
        their_kps = np.load(work / f"pack.{k}.kps.npy")
        counts[0].append(len(faces))
        counts[1].append(len(theirs))
        if len(faces) != len(theirs):
            same = False
            continue
        if not faces:
            continue
        ours = embedder.embed_raw(np.stack([f.crop for f in faces]))
        emb_d = max(emb_d, float(np.abs(ours - theirs).max()))
        kps_d = max(
            kps_d, float(np.abs(np.stack([f.face.landmarks for f in faces]) - their_kps).max())
        )
        cosines += list(
            (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
        )
    return {
        "files": {
            "detector": detector.path.name,
            "recogniser": embedder.backend.path.name,
            "ignored": ["1k3d68.onnx", "genderage.onnx"],
        },
        "photos": len(photos),
        "faces_per_photo_partialfc": counts[0],
        "faces_per_photo_insightface": counts[1],
        "same_count_every_photo": same,
        "faces_compared": len(cosines),
        "keypoints_max_abs_delta": kps_d,
        "embeddings_max_abs_delta": emb_d,
        "embeddings_min_cosine": float(min(cosines)) if cosines else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--insightface-python", required=True, help="python with insightface")
    parser.add_argument("--shared", default="../shared/data", help="shared data folder")
    parser.add_argument("--faces", type=int, default=128, help="LFW faces for recognition")
    parser.add_argument("--out", default="benchmarks/results/insightface_onnx_interop.json")
    args = parser.parse_args()
    torch.set_num_threads(1)

    from partialfc.backbone.embedder import Embedder
    from partialfc.data.align import align_face
    from partialfc.detect import largest_face, load_detector
    from partialfc.detect.scrfd import SCRFD
    from tests.insightface_graphs import other_graph, recognition_graph, scrfd_red_graph

    shared = Path(args.shared)
    with tempfile.TemporaryDirectory(prefix="insightface-interop-") as tmp:
        work = Path(tmp)
        export_bare_iresnet(work / "iresnet_small_bare.onnx")
        recognition_graph(work / "mxnet_style.onnx", dim=64, normalises_inside=True)
        export_random_scrfd(work / "scrfd_random.onnx")
        scrfd_red_graph(work / "scrfd_red.onnx")

        mtcnn = load_detector("mtcnn")
        photos, landmarks, crops = [], [], []
        for image in lfw_photos(shared, args.faces * 2):
            face = largest_face(mtcnn.detect(image))
            if face is None:
                continue
            photos.append(image)
            landmarks.append(face.landmarks)
            crops.append(align_face(image, face.landmarks, size=112))
            if len(crops) == args.faces:
                break
        np.save(work / "crops_rgb.npy", np.stack(crops))
        np.save(work / "photos_rgb.npy", np.stack(photos))
        np.save(work / "landmarks.npy", np.stack(landmarks).astype(np.float32))

        collage = np.full((200, 420, 3), 90, np.uint8)
        collage[25:175, 10:160], collage[25:175, 250:400] = photos[0], photos[1]
        red = np.zeros((480, 700, 3), np.uint8)
        red[100:190, 200:290, 0] = 255
        detection_photos = [*photos[2:8], collage, red, *orl_photos(shared, 4)]
        for k, image in enumerate(detection_photos):
            np.save(work / f"det_photo_{k}.npy", image)
        recognition = ["iresnet_small_bare.onnx", "mxnet_style.onnx"]
        detection = ["scrfd_random.onnx", "scrfd_red.onnx"]
        task = {"recognition": recognition, "detection": detection}
        task["detection_photos"] = len(detection_photos)
        (work / "task.json").write_text(json.dumps(task))
        pack = work / "models" / "pack"  # laid out as InsightFace's root/models/<name>
        pack.mkdir(parents=True)
        (pack / "det_10g.onnx").write_bytes((work / "scrfd_random.onnx").read_bytes())
        (pack / "w600k_r50.onnx").write_bytes((work / "iresnet_small_bare.onnx").read_bytes())
        other_graph(pack / "1k3d68.onnx", side=192)  # landmark-shaped: ignored by both
        other_graph(pack / "genderage.onnx", side=96)
        done = subprocess.run(
            [args.insightface_python, "-c", INSIGHTFACE_SIDE, str(work)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.exit(f"insightface side failed:\n{done.stderr}")
        versions = json.loads(done.stdout.strip().splitlines()[-1])

        result = {
            "versions": {
                **versions,
                "onnxruntime": __import__("onnxruntime").__version__,
                "python": platform.python_version(),
            },
            "recognition": {},
            "alignment": {},
            "detection": {},
        }
        crops = np.stack(crops)
        for name in recognition:
            embedder = Embedder.load(work / name)
            ours = embedder.embed_raw(crops)
            theirs = np.load(work / f"{name}.feat.npy")
            cosine = (ours * theirs).sum(1) / (
                np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
            )
            mean, std = np.load(work / f"{name}.mean_std.npy").tolist()
            result["recognition"][name] = {
                "crops": len(crops),
                "partialfc_preprocessing": embedder.preprocessing_source,
                "partialfc_mean_std_0_255": [
                    embedder.spec.mean[0] * 255,
                    embedder.spec.std[0] * 255,
                ],
                "insightface_input_mean_std": [mean, std],
                "max_abs_delta": float(np.abs(ours - theirs).max()),
                "max_abs_feature": float(np.abs(theirs).max()),
                "min_cosine": float(cosine.min()),
            }
        norm_crop = np.load(work / "norm_crop_rgb.npy").astype(np.int16)
        delta = np.abs(crops.astype(np.int16) - norm_crop)
        result["alignment"] = {
            "crops": len(crops),
            "max_abs_delta_pixel_value": int(delta.max()),
            "pixels_differing": int((delta > 0).sum()),
            "pixels": int(delta.size),
        }
        for name in detection:
            detector = SCRFD(work / name, input_size=(640, 640))
            counts, same, box_d, kps_d, score_d, faces = ([], []), True, 0.0, 0.0, 0.0, 0
            for k, image in enumerate(detection_photos):
                ours = detector.detect_arrays(image)
                det = np.load(work / f"{name}.{k}.det.npy")
                kps = np.load(work / f"{name}.{k}.kps.npy")
                counts[0].append(len(ours.boxes))
                counts[1].append(len(det))
                if len(ours.boxes) != len(det):
                    same = False
                    continue
                faces += len(det)
                if len(det):
                    box_d = max(box_d, float(np.abs(ours.boxes - det[:, :4]).max()))
                    score_d = max(score_d, float(np.abs(ours.scores - det[:, 4]).max()))
                    kps_d = max(kps_d, float(np.abs(ours.keypoints - kps).max()))
            result["detection"][name] = {
                "photos": len(detection_photos),
                "faces_per_photo_partialfc": counts[0],
                "faces_per_photo_insightface": counts[1],
                "same_count_every_photo": same,
                "detections_compared": faces,
                "boxes_max_abs_delta": box_d,
                "keypoints_max_abs_delta": kps_d,
                "scores_max_abs_delta": score_d,
            }
        result["model_pack"] = compare_pack(pack, work, detection_photos)
    out = Path(args.out)
    text = json.dumps(result, indent=2)
    # lists of counts on one line
    text = re.sub(
        r"\[([\d,\s]+)\]", lambda m: "[" + ", ".join(v.strip() for v in m[1].split(",")) + "]", text
    )
    out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
