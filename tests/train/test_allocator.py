"""``keep_freed_memory``: blocks freed by one step are reused by the next instead of being
mapped in again (counted as minor page faults, each case in a fresh process), and an environment
that tunes malloc itself is left alone."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from partialfc.train.allocator import keep_freed_memory, malloc_tuned_by_environment

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc"
)

# ten "steps", each allocating, touching and freeing three 10 MiB blocks (30 MiB, 7,680 pages)
_STEPS = """
import resource, sys
import numpy as np
from partialfc.train.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    blocks = [np.ones(10 * 2**20, np.uint8) for _ in range(3)]
    del blocks
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
    env = {"PATH": "/usr/bin:/bin"}  # no MALLOC_* variables from the caller
    out = subprocess.run(
        [sys.executable, "-c", _STEPS, mode], capture_output=True, text=True, env=env, check=True
    )
    return int(out.stdout)


@glibc_only
def test_later_steps_reuse_the_first_steps_memory():
    kept, default = _page_faults("keep"), _page_faults("default")
    pages_one_step = 3 * 10 * 2**20 // 4096
    # at most the first step's pages are faulted in; glibc's default maps them in again later
    assert kept <= pages_one_step
    assert default > 3 * kept


@pytest.mark.parametrize(
    ("environ", "tuned"),
    [
        ({}, False),
        ({"MALLOC_TRIM_THRESHOLD_": "1000000000"}, True),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, True),
        ({"MALLOC_TOP_PAD_": "0"}, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}, True),
        ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, False),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, False),
    ],
)
def test_an_environment_that_tunes_malloc_is_left_alone(environ, tuned):
    assert malloc_tuned_by_environment(environ) is tuned
    if tuned:
        assert keep_freed_memory(environ) is False
