"""``partialfc align``: photos in, aligned crops per identity and a report out."""

from __future__ import annotations

import json

import cv2
import numpy as np

from partialfc.cli import main
from partialfc.data.decode import decode_image


def _write(path, rgb):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def test_align_folder_reports_no_face_and_several_faces(lfw_photos, tmp_path, capsys):
    src, dst = tmp_path / "photos", tmp_path / "aligned"
    _write(src / "alice" / "a1.png", lfw_photos[0][1])
    _write(src / "alice" / "a2.png", lfw_photos[1][1])
    group = np.full((200, 400, 3), 90, np.uint8)
    group[25:175, 10:160], group[25:175, 230:380] = lfw_photos[2][1], lfw_photos[3][1]
    _write(src / "bob" / "group.png", group)
    _write(src / "bob" / "wall.png", np.full((120, 120, 3), 128, np.uint8))

    assert main(["align", str(src), str(dst)]) == 0
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert summary["photos"] == 4 and summary["faces"] == 3
    assert summary["no_face"] == [str(src / "bob" / "wall.png")]
    assert summary["several_faces"] == {str(src / "bob" / "group.png"): 2}
    assert "no face found in 1 photo" in out.err
    crops = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*.png"))
    assert crops == ["alice/a1.png", "alice/a2.png", "bob/group.png"]
    image = decode_image((dst / "alice" / "a1.png").read_bytes())
    assert image.shape == (112, 112, 3)
    report = json.loads((dst / "align_report.json").read_text())
    row = next(r for r in report["crops"] if r["source"].endswith("group.png"))
    assert len(row["box"]) == 4 and len(row["landmarks"]) == 5 and row["score"] > 0.9

    # --all-faces: one crop per face, numbered
    dst2 = tmp_path / "all"
    assert main(["align", str(src / "bob"), str(dst2), "--all-faces", "--format", "jpg"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in dst2.glob("*.jpg")) == ["group_0.jpg", "group_1.jpg"]


def test_align_errors_are_clear(tmp_path, capsys):
    assert main(["align", str(tmp_path / "missing"), str(tmp_path / "out")]) == 2
    assert "missing: photo folder not found" in capsys.readouterr().err
    (tmp_path / "src").mkdir()
    _write(tmp_path / "src" / "wall.png", np.full((80, 80, 3), 128, np.uint8))
    assert main(["align", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert "no face aligned" in capsys.readouterr().err


def test_pack_detect_packs_aligned_faces(lfw_photos, tmp_path, capsys):
    from partialfc.data import RecordIODataset

    src = tmp_path / "photos"
    _write(src / "alice" / "a1.jpg", lfw_photos[0][1])
    _write(src / "bob" / "b1.jpg", lfw_photos[1][1])
    _write(src / "bob" / "wall.jpg", np.full((90, 90, 3), 128, np.uint8))
    rec = tmp_path / "faces.rec"
    assert main(["pack", str(src), str(rec), "--detect", "--workers", "1"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 2 and summary["classes"] == 2
    assert summary["aligned"]["no_face"] == [str(src / "bob" / "wall.jpg")]
    image, label = RecordIODataset(rec)[1][:2]
    assert tuple(image.shape) == (3, 112, 112) and label == 1
