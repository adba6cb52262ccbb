"""The loss tests use tiny tensors: one thread avoids OpenMP hand-off costs on a busy machine."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
