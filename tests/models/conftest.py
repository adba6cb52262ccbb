import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Small batches: one thread avoids oversubscription on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
