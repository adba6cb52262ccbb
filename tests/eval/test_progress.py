"""Progress bars of evaluation: embedding counts every image, pair scoring every pair, and the
bars follow the process setting (on a terminal only by default)."""

from __future__ import annotations

import numpy as np
import pytest

import partialfc.eval.embedding as embedding_module
import partialfc.eval.pair_scoring as pair_scoring_module
from partialfc.eval import progress
from partialfc.eval.embedding import embed_images
from partialfc.eval.pair_scoring import score_all_pairs


class Recorder:
    """Stands in for a tqdm bar and keeps what it was told."""

    bars: list = []

    def __init__(self, total, desc, unit):
        self.total, self.desc, self.unit, self.n, self.closed = total, desc, unit, 0, False
        Recorder.bars.append(self)

    def update(self, n):
        self.n += n

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def recorder(monkeypatch):
    Recorder.bars = []
    monkeypatch.setattr(embedding_module, "progress_bar", Recorder)
    monkeypatch.setattr(pair_scoring_module, "progress_bar", Recorder)
    return Recorder


def test_embedding_bar_counts_every_image(recorder):
    images = np.zeros((10, 4, 4), np.uint8)
    embed_images(lambda x: np.ones((len(x), 3), np.float32), images, flip=True, batch_size=4)
    (bar,) = recorder.bars
    # 10 images and their 10 mirror images (flip test)
    assert (bar.desc, bar.unit, bar.total, bar.n, bar.closed) == ("embedding", "img", 20, 20, True)


@pytest.mark.parametrize(("n", "block"), [(7, 3), (9, 3), (5, 8)])
def test_pair_bar_counts_every_pair_once(recorder, n, block):
    rng = np.random.default_rng(0)
    e = rng.normal(size=(n, 4)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    labels = np.arange(n) % 3
    summary = score_all_pairs(e, labels, block=block, sub_block=2)
    (bar,) = recorder.bars
    assert bar.total == bar.n == n * (n - 1) // 2 and bar.closed
    assert summary.n_impostor + len(summary.genuine_scores) == n * (n - 1) // 2


def test_setting_decides_whether_bars_show(capsys):
    try:
        progress.set_progress(False)
        with progress.progress_bar(5, "x", "img") as bar:
            assert bar.disable
        progress.set_progress(True)
        with progress.progress_bar(5, "scoring pairs", "pair") as bar:
            assert not bar.disable
            bar.update(5)
        assert "scoring pairs" in capsys.readouterr().err
        progress.set_progress(None)  # the default: only on a terminal (captured stderr is not)
        with progress.progress_bar(5, "x", "img") as bar:
            assert bar.disable
    finally:
        progress.set_progress(None)
