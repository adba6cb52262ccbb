"""Atomic output: the target is either the old file or the complete new one, never partial."""

from __future__ import annotations

import pytest

from partialfc.atomic import atomic_output, atomic_write_bytes


def test_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "file.bin"
    atomic_write_bytes(target, b"first")
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.bin"]


def test_failure_inside_the_block_keeps_the_old_file(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="writer died"):
        with atomic_output(target) as tmp:
            tmp.write_bytes(b"half-writ")
            raise RuntimeError("writer died")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
