"""Omniglot protocols (bundled data, unseen classes): open-set pairs at scale, 20-way one-shot.

* ``OmniglotOpenSet``: all pairs of the 13,180 evaluation-set images (659 classes never seen
  in training): 125,210 genuine and ~8.7·10^7 impostor pairs, enough to measure FAR = 10^-6
  with ~87 false accepts. Scored blockwise (:mod:`partialfc.eval.pair_scoring`). The same
  embeddings also give an open-set identification report: every other evaluation class is
  enrolled with its first drawing (one-shot gallery of 330 classes); the other 19 drawings of
  enrolled classes are mated probes (closed-set CMC, rank-1), and all drawings of the 329
  classes left out are non-mated probes (FNIR at FPIR).
* ``OmniglotOneShot``: Lake's 20 runs of 20-way one-shot classification (400 trials); each
  test image is matched to the nearest of 20 training images. Reported as a CMC over those
  runs (rank-1 = one-shot accuracy).
* ``OmniglotHoldout``: the same two measurements on background alphabets held out of training
  (:mod:`partialfc.data.omniglot_holdout`), for choosing recipe levers without looking at the
  evaluation alphabets: 20-way one-shot episodes built like Lake's runs (20 characters of one
  alphabet, enrolled drawings by one drawer, queries by another; 20 episodes per alphabet,
  seed 0) and all pairs of the held-out images.
"""

from __future__ import annotations

import numpy as np

from ..embedding import EmbedFn, embed_images
from ..identification import cmc_from_ranks, mated_search
from ..pair_scoring import score_all_pairs
from ..reports import (
    IdentificationReport,
    VerificationReport,
    identification_report,
    verification_report,
)
from .base import Protocol

OPEN_SET_FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
HOLDOUT_FARS = (1e-5, 1e-4, 1e-3, 1e-2)


class OmniglotOpenSet(Protocol):
    def __init__(
        self,
        size: int = 28,
        root=None,
        flip: bool = False,
        batch_size: int = 256,
        fars=OPEN_SET_FARS,
        max_images: int | None = None,
    ):
        self.size, self.root, self.flip, self.batch_size = size, root, flip, batch_size
        self.fars, self.max_images = fars, max_images
        self.name = f"omniglot_eval_open_set_{size}"

    def run(self, embed_fn: EmbedFn) -> list[VerificationReport | IdentificationReport]:
        from partialfc.data.loaders import load_omniglot

        data = load_omniglot("evaluation", size=self.size, root=self.root)
        images, labels = data.images, data.labels
        if self.max_images is not None:
            images, labels = images[: self.max_images], labels[: self.max_images]
        emb = embed_images(embed_fn, images, self.flip, self.batch_size)
        keep_top = int(max(self.fars, default=0) * len(emb) ** 2 / 2) + 2
        summary = score_all_pairs(emb, labels, keep_top=keep_top)
        return [
            verification_report(
                self.name,
                summary=summary,
                fars=self.fars,
                notes=[f"{len(emb)} images of {np.unique(labels).size} unseen classes, all pairs"],
            ),
            one_shot_gallery_identification(f"{self.name}_identification", emb, labels),
        ]


def one_shot_gallery_identification(
    name: str, embeddings: np.ndarray, labels: np.ndarray
) -> IdentificationReport:
    """Enroll every other class (in label order) by its first image; search all other images.

    Mated probes: the remaining images of enrolled classes (closed-set CMC). Non-mated probes:
    every image of the classes left out (open-set FNIR at FPIR).
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    enrolled = classes[::2]
    first = np.array([np.flatnonzero(labels == c)[0] for c in enrolled])
    probe = np.ones(labels.size, dtype=bool)
    probe[first] = False
    return identification_report(
        name,
        embeddings[first],
        labels[first],
        embeddings[probe],
        labels[probe],
        notes=[
            f"gallery: first image of {enrolled.size} of {classes.size} unseen classes; "
            f"non-mated probes: all images of the other {classes.size - enrolled.size}"
        ],
    )


class OmniglotOneShot(Protocol):
    """Lake's 20 runs of 20-way one-shot classification; rank-1 is the one-shot accuracy.

    ``PUBLISHED`` holds the published accuracies on the same runs: Siamese networks (Koch et
    al., ICML Deep Learning Workshop 2015), people and Bayesian Program Learning (Lake et al.,
    Science 2015).
    """

    PUBLISHED = {"Siamese": 0.920, "humans": 0.955, "BPL": 0.967}

    def __init__(self, size: int = 28, root=None, flip: bool = False, batch_size: int = 256):
        self.size, self.root, self.flip, self.batch_size = size, root, flip, batch_size
        self.name = f"omniglot_one_shot_20way_{size}"

    def run(self, embed_fn: EmbedFn) -> list[IdentificationReport]:
        from partialfc.data.loaders import load_omniglot_one_shot_runs

        runs = load_omniglot_one_shot_runs(size=self.size, root=self.root)
        ranks = []
        for run in runs:
            gallery = embed_images(embed_fn, run.training_images, self.flip, self.batch_size)
            probes = embed_images(embed_fn, run.test_images, self.flip, self.batch_size)
            found = mated_search(probes @ gallery.T, run.answers, np.arange(len(gallery)))
            ranks.append(found.ranks)
        ranks = np.concatenate(ranks)
        return [
            IdentificationReport(
                name=self.name,
                n_gallery_identities=20,
                n_mated_probes=int(ranks.size),
                cmc=cmc_from_ranks(ranks, max_rank=20),
                notes=[f"{len(runs)} runs x 20 trials; rank-1 = one-shot accuracy"],
            )
        ]


def episode_ranks(embeddings: np.ndarray, episodes) -> np.ndarray:
    """Rank (1 = nearest) of each query's own enrolled drawing in its episode, by the inner
    product of ``embeddings`` (L2-normalised: cosine similarity); a tie counts against the
    query (:func:`partialfc.eval.identification.mated_search`). ``mean(ranks == 1)`` is the
    one-shot accuracy."""
    ranks = []
    for episode in episodes:
        ways = np.arange(len(episode.enrolled))
        similarity = embeddings[episode.queries] @ embeddings[episode.enrolled].T
        ranks.append(mated_search(similarity, ways, ways).ranks)
    return np.concatenate(ranks)


class OmniglotHoldout(Protocol):
    """One-shot episodes and all pairs on held-out background alphabets (lever selection).

    ``alphabets``: background alphabet names (at least 20 characters each), as resolved from
    ``data.holdout_background_alphabets``. ``episodes_per_alphabet`` (default 20) 20-way
    episodes per alphabet from ``seed`` (default 0). Reports ``omniglot_holdout_one_shot_20way_
    <size>`` (CMC; rank-1 = one-shot accuracy) and ``omniglot_holdout_open_set_<size>``
    (all pairs of the held-out images: TAR@FAR with k, ROC AUC, EER).
    """

    def __init__(
        self,
        alphabets,
        size: int = 28,
        root=None,
        flip: bool = False,
        batch_size: int = 512,
        episodes_per_alphabet: int = 20,
        seed: int = 0,
        fars=HOLDOUT_FARS,
    ):
        if not alphabets:
            raise ValueError("OmniglotHoldout needs at least one held-out alphabet")
        self.alphabets = list(alphabets)
        self.size, self.root, self.flip, self.batch_size = size, root, flip, batch_size
        self.episodes_per_alphabet, self.seed, self.fars = episodes_per_alphabet, seed, fars
        self.name = f"omniglot_holdout_{size}"

    def run(self, embed_fn: EmbedFn) -> list[VerificationReport | IdentificationReport]:
        from partialfc.data.loaders import load_omniglot
        from partialfc.data.omniglot_holdout import build_one_shot_episodes

        data = load_omniglot("background", size=self.size, root=self.root, alphabets=self.alphabets)
        episodes = build_one_shot_episodes(
            data.labels,
            data.drawers,
            data.alphabets,
            episodes_per_alphabet=self.episodes_per_alphabet,
            seed=self.seed,
        )
        emb = embed_images(embed_fn, data.images, self.flip, self.batch_size)
        ranks = episode_ranks(emb, episodes)
        keep_top = int(max(self.fars, default=0) * len(emb) ** 2 / 2) + 2
        summary = score_all_pairs(emb, data.labels, keep_top=keep_top)
        held_out = f"{data.num_classes} characters of {len(self.alphabets)} held-out alphabets"
        return [
            IdentificationReport(
                name=f"omniglot_holdout_one_shot_20way_{self.size}",
                n_gallery_identities=20,
                n_mated_probes=int(ranks.size),
                cmc=cmc_from_ranks(ranks, max_rank=20),
                notes=[
                    f"{len(episodes)} episodes x 20 trials on {held_out} "
                    f"({', '.join(self.alphabets)}); seed {self.seed}; rank-1 = one-shot accuracy"
                ],
            ),
            verification_report(
                f"omniglot_holdout_open_set_{self.size}",
                summary=summary,
                fars=self.fars,
                notes=[f"{len(emb)} images of {held_out}, all pairs"],
            ),
        ]
