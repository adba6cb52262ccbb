"""Advisory file locks: a second holder waits, says so, and gives up after its timeout."""

from __future__ import annotations

import pytest

from partialfc.locking import LockTimeout, file_lock, lock_path


def test_a_held_lock_makes_the_next_holder_wait_and_say_so(tmp_path):
    target = tmp_path / "g.npz"
    lines = []
    with file_lock(target):
        assert lock_path(target) == tmp_path / ".g.npz.lock"
        with pytest.raises(LockTimeout, match=r"g\.npz: still locked by another process"):
            with file_lock(target, timeout=0.1, log=lines.append):
                pass
    assert lines == [f"waiting for lock on {target} held by another process (waiting up to 0.1 s)"]
    with file_lock(target, timeout=0, log=lines.append):  # released: taken at once, no line
        pass
    assert len(lines) == 1
