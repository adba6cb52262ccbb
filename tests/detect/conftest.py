"""Real LFW colour photos (150x150, one centred face each) and one shared MTCNN detector."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="session")
def detector():
    from partialfc.detect import load_detector

    return load_detector("mtcnn")


def lfw_colour(shared_root, count: int, step: int = 97) -> list[tuple[str, np.ndarray]]:
    """``count`` LFW colour images spread over the archive (every ``step``-th, sorted names)."""
    path = shared_root / "lfw_dev" / "lfw_color150_dev.zip"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    with zipfile.ZipFile(path) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".jpg"))[::step][:count]
        return [(n, np.asarray(Image.open(io.BytesIO(z.read(n))).convert("RGB"))) for n in names]


@pytest.fixture(scope="session")
def lfw_photos(request):
    from tests.conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return lfw_colour(SHARED_DATA, 16)
