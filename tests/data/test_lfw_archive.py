"""LfwImageArchive on a tiny zip and folder written here (no shared data needed)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from PIL import Image

from partialfc.data import LfwImageArchive


def _jpeg(value: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


MEMBERS = {"Bob_Smith/Bob_Smith_0002.jpg": 40, "Ann_Lee/Ann_Lee_0001.jpg": 200}


@pytest.fixture(params=["zip", "folder"])
def archive(request, tmp_path):
    if request.param == "zip":
        path = tmp_path / "faces.zip"
        with zipfile.ZipFile(path, "w") as z:
            for member, value in MEMBERS.items():
                z.writestr(f"lfw150/{member}", _jpeg(value))
            z.writestr("lfw150/README.txt", b"not an image")
        return LfwImageArchive(path)
    for member, value in MEMBERS.items():
        file = tmp_path / member
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(_jpeg(value))
    (tmp_path / "notes.txt").write_text("not an image")
    return LfwImageArchive(tmp_path)


def test_image_ids_list_every_jpeg_sorted(archive):
    assert archive.image_ids() == ["Ann_Lee_0001", "Bob_Smith_0002"]


def test_each_listed_id_reads_back_its_image(archive):
    for image_id in archive.image_ids():
        name, number = image_id.rsplit("_", 1)
        image = archive.read(name, int(number))
        expected = MEMBERS[f"{name}/{image_id}.jpg"]
        assert image.shape == (8, 8, 3) and abs(float(image.mean()) - expected) < 3
