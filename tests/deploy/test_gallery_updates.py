"""Gallery updates in place (``Gallery.updating``, ``search --enroll``) are serialised by the
file's lock: concurrent real processes never lose an identity."""

from __future__ import annotations

import contextlib
import multiprocessing

import numpy as np

from partialfc.deploy.gallery import Gallery
from partialfc.locking import file_lock

WORKERS, ROUNDS, DIM = 4, 6, 8


def _enroller(path: str, worker: int, start, locked: bool) -> None:
    """Enroll identities ``w<worker>_<round>`` one update at a time (a fresh read each round)."""
    if not locked:  # the same update with the lock taken out: what an unserialised writer does
        import partialfc.deploy.gallery as gallery_module

        gallery_module.file_lock = lambda *args, **kwargs: contextlib.nullcontext()
    start.wait()
    rng = np.random.default_rng(worker)
    for r in range(ROUNDS):
        with Gallery.updating(path, DIM, "m") as gallery:
            gallery.enroll(f"w{worker}_{r}", rng.normal(size=(2, DIM)))


def _run_enrollers(path, locked: bool) -> Gallery:
    ctx = multiprocessing.get_context("fork")  # real processes, without re-importing torch
    start = ctx.Event()
    procs = [
        ctx.Process(target=_enroller, args=(str(path), w, start, locked)) for w in range(WORKERS)
    ]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return Gallery.open(path)


def _expected() -> set[str]:
    return {f"w{w}_{r}" for w in range(WORKERS) for r in range(ROUNDS)}


def test_concurrent_enrollers_keep_every_identity(tmp_path):
    gallery = _run_enrollers(tmp_path / "g.npz", locked=True)
    assert set(gallery.identities) == _expected()
    assert all(gallery.count(name) == 2 for name in _expected())


def test_without_the_lock_concurrent_enrollers_lose_identities(tmp_path):
    """The check above can fail: the same workers with the lock removed lose updates."""
    lost = 0
    for trial in range(3):  # the race is near-certain in one trial; three make it certain enough
        gallery = _run_enrollers(tmp_path / f"g{trial}.npz", locked=False)
        assert set(gallery.identities) <= _expected()
        lost += len(_expected()) - len(gallery)
        if lost:
            break
    assert lost > 0


def test_search_waits_for_the_gallery_lock_and_gives_up_after_the_timeout(
    tmp_path, capsys, monkeypatch
):
    """``search --enroll`` goes through the lock: held elsewhere, it says so and stops."""
    import argparse

    from partialfc.deploy import command

    path = tmp_path / "g.npz"
    Gallery(DIM, "m").save(path)
    args = command_args(path)

    class Fake:
        embedding_dim = DIM
        model_sha256 = None
        spec = argparse.Namespace(in_channels=1)

    monkeypatch.setattr(command, "_load", lambda args: Fake())
    monkeypatch.setattr(
        command,
        "_embed_labelled",
        lambda *a: command.Labelled(
            np.ones((1, DIM)), np.zeros(1, dtype=np.int64), ["new"], ["x.png"], {}, []
        ),
    )
    with file_lock(path):
        assert command.run(args) == 2
    err = capsys.readouterr().err
    assert f"waiting for lock on {path} held by another process" in err
    assert "still locked by another process after 0.2 s" in err
    assert len(Gallery.open(path)) == 0  # nothing written while it was held
    assert command.run(args) == 0
    assert Gallery.open(path).identities == ["new"]


def command_args(path):
    import argparse

    return argparse.Namespace(
        command="search",
        model="m",
        gallery=str(path),
        enroll="folder",
        remove=[],
        query=None,
        threshold=None,
        lock_timeout=0.2,
        detect=False,
        batch_size=8,
        top_k=5,
        flip=False,
        skip_bad=False,
    )
