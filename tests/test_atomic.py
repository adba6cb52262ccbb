"""Atomic output: the target is either the old file or the complete new one, never partial."""

from __future__ import annotations

import os
import stat

import pytest

from partialfc.atomic import AtomicFile, atomic_output, atomic_write_bytes


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


def _writers():
    """Every writer that goes through the atomic helpers: name -> function(folder) -> path."""
    from types import SimpleNamespace

    import numpy as np

    from partialfc.data.recordio import IRHeader, RecordIOWriter, build_index, pack_record
    from partialfc.data.verification_bin import write_verification_bin
    from partialfc.deploy.gallery import Gallery
    from partialfc.eval.report_writer import _plot
    from partialfc.tools.cleaning import write_cleaned_set
    from partialfc.train.config import load_config, save_config

    def output(folder):
        with atomic_output(folder / "out.bin") as tmp:
            tmp.write_bytes(b"x")
        return folder / "out.bin"

    def verification(folder):
        write_verification_bin(folder / "v.bin", [b"a", b"b"], [True])
        return folder / "v.bin"

    def gallery(folder):
        g = Gallery(4)
        g.enroll("a", np.ones((1, 4)))
        g.save(folder / "g.npz")
        return folder / "g.npz"

    def config(folder):
        save_config(load_config(None, ["data.source=omniglot"]), folder / "config.yaml")
        return folder / "config.yaml"

    def plot(folder):
        _plot(folder / "roc.png", lambda ax: ax.plot([0, 1], [0, 1], label="line"))
        return folder / "roc.png"

    def cleaned(folder):
        data = SimpleNamespace(images=np.zeros((2, 2, 2), np.uint8), labels=np.array([0, 1]))
        write_cleaned_set(data, np.array([True, False]), folder)
        return folder / "cleaned.npz"

    def recordio(folder):
        with RecordIOWriter(folder / "r.rec") as writer:
            writer.write(0, pack_record(IRHeader(0, 1.0, 0), b"image"))
        build_index(folder / "r.rec", folder / "rebuilt.idx")
        return [folder / "r.rec", folder / "r.idx", folder / "rebuilt.idx"]

    def backbone(folder):
        from partialfc.backbone.io import save_backbone
        from partialfc.models import build_model

        config = {"name": "iresnet_small", "kwargs": {"embedding_dim": 4, "input_size": 16}}
        save_backbone(build_model(config["name"], **config["kwargs"]), config, folder / "m")
        return sorted(p for p in (folder / "m").iterdir() if p.is_file())

    return {
        "save_backbone (safetensors)": backbone,
        "atomic_write_bytes": lambda folder: atomic_write_bytes(folder / "f", b"x") or folder / "f",
        "atomic_output": output,
        "write_verification_bin": verification,
        "Gallery.save": gallery,
        "save_config": config,
        "report plot": plot,
        "write_cleaned_set": cleaned,
        "RecordIOWriter + build_index": recordio,
    }


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
@pytest.mark.parametrize("writer", list(_writers()))
def test_written_files_follow_the_umask_like_open(tmp_path, writer, umask, mode):
    """Output files get 0o666 minus the umask, as ``open(path, "w")`` would give them."""
    old = os.umask(umask)
    try:
        paths = _writers()[writer](tmp_path)
        plain = tmp_path / "plain"
        plain.write_bytes(b"")
    finally:
        os.umask(old)
    assert stat.S_IMODE(plain.stat().st_mode) == mode
    for path in paths if isinstance(paths, list) else [paths]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path.name
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"folder .*missing does not exist"):
        AtomicFile(tmp_path / "missing" / "file.bin")
    assert list(tmp_path.iterdir()) == []
