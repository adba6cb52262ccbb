"""Shared test fixtures: locations of the real datasets and a deterministic torch setup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PARTIALFC_SHARED_DATA", REPO.parent / "shared" / "data"))
BUNDLED_OMNIGLOT = REPO / "partialfc" / "data" / "bundled" / "omniglot"


@pytest.fixture(autouse=True)
def _deterministic_torch():
    """Seeded, single-threaded torch for every test.

    Test tensors are small: one intra-op thread avoids OpenMP hand-off costs, which dominate
    (and vary wildly) when the cores are shared with other work.
    """
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def shared_data() -> Path:
    """../shared/data (real datasets). Present in CI; skipped on a bare user clone."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture
def bundled_omniglot() -> Path:
    return BUNDLED_OMNIGLOT
