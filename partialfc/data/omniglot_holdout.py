"""Held-out Omniglot background alphabets, and 20-way one-shot episodes built on them.

Recipe choices compared on Lake's 20 runs (the evaluation alphabets) are chosen on the test
split. The clean protocol holds out some of the 30 *background* alphabets instead: their
characters leave the training set, and levers are compared on one-shot episodes built from
them the way Lake's runs are built (Lake et al., "Human-level concept learning through
probabilistic program induction", Science 2015, supplementary section on one-shot
classification): each episode takes 20 characters of one alphabet, enrols the drawing of each
by one drawer and queries with the drawings of the same 20 characters by another drawer.

Which alphabets: either names, or an integer N = the last N alphabets of
:func:`holdout_candidates` (background alphabets with at least 20 characters, in the order of
the data file's ``alphabet`` index). Lake's runs are reported once, at the end.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ONE_SHOT_WAYS = 20


def holdout_candidates(
    root: str | os.PathLike | None = None, ways: int = ONE_SHOT_WAYS
) -> list[str]:
    """Background alphabets with at least ``ways`` characters (default 20), in file order.

    The bundled ``omniglot_28.npz`` (default ``root``) gives 26 of the 30 (Blackfoot,
    Inuktitut, Ojibwe and Tagalog have 14-17 characters).
    """
    counts = _background_character_counts(root)
    return [name for name, count in counts.items() if count >= ways]


def _background_character_counts(root) -> dict[str, int]:
    """``{alphabet: number of characters}`` of the background set, in alphabet-index order."""
    from .loaders import BUNDLED_OMNIGLOT, _load_npz, _npz_path

    data = _load_npz(_npz_path(root, BUNDLED_OMNIGLOT, "omniglot_28.npz"))
    names = [str(a) for a in data["alphabet_names"]]
    index, counts = np.unique(data["alphabet"][data["is_background"]], return_counts=True)
    return {names[i]: int(c) for i, c in zip(index, counts, strict=True)}


def resolve_holdout_alphabets(
    spec: int | Sequence[str], root: str | os.PathLike | None = None
) -> list[str]:
    """Alphabet names for ``spec``: an integer N (the last N of :func:`holdout_candidates`,
    0 = none) or a list of background alphabet names with at least 20 characters each.

    Raises ValueError for N out of [0, number of candidates], an unknown name, an evaluation
    alphabet (those are Lake's test split), a repeated name or one with too few characters.
    """
    candidates = holdout_candidates(root)
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple)):
        raise ValueError(f"expected an integer or a list of alphabet names, got {spec!r}")
    if isinstance(spec, int):
        if not 0 <= spec <= len(candidates):
            raise ValueError(
                f"must be an integer in [0, {len(candidates)}] (the background alphabets with "
                f"at least {ONE_SHOT_WAYS} characters), got {spec}"
            )
        return candidates[len(candidates) - spec :] if spec else []
    counts = _background_character_counts(root)
    evaluation = _evaluation_alphabets(root)
    seen: set[str] = set()
    for name in spec:
        if not isinstance(name, str):
            raise ValueError(f"expected alphabet names, got {name!r}")
        if name in evaluation:
            raise ValueError(
                f"{name!r} is an evaluation alphabet (Lake's one-shot runs): choose among the "
                f"background alphabets {', '.join(candidates)}"
            )
        if name not in counts:
            raise ValueError(
                f"{name!r} is not an Omniglot alphabet; background alphabets with at least "
                f"{ONE_SHOT_WAYS} characters: {', '.join(candidates)}"
            )
        if counts[name] < ONE_SHOT_WAYS:
            raise ValueError(
                f"{name!r} has {counts[name]} characters; a {ONE_SHOT_WAYS}-way episode needs "
                f"at least {ONE_SHOT_WAYS}"
            )
        if name in seen:
            raise ValueError(f"{name!r} is named twice")
        seen.add(name)
    if len(seen) == len(counts):
        raise ValueError("every background alphabet is held out: nothing is left to train on")
    return list(spec)


def holdout_alphabets_from_text(text: str, where: str) -> list[str]:
    """``"5"`` or ``"N_Ko,Tifinagh"`` (a protocol argument or a command-line value) resolved
    by :func:`resolve_holdout_alphabets`; ValueError naming ``where``, also for none."""
    text = str(text).strip()
    spec = int(text) if text.isdigit() else [name.strip() for name in text.split(",")]
    try:
        alphabets = resolve_holdout_alphabets(spec)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    if not alphabets:
        raise ValueError(f"{where}: 0 holds out no alphabet")
    return alphabets


def _evaluation_alphabets(root) -> set[str]:
    from .loaders import BUNDLED_OMNIGLOT, _load_npz, _npz_path

    data = _load_npz(_npz_path(root, BUNDLED_OMNIGLOT, "omniglot_28.npz"))
    names = [str(a) for a in data["alphabet_names"]]
    return {names[i] for i in np.unique(data["alphabet"][~data["is_background"]])}


@dataclass(frozen=True)
class OneShotEpisode:
    """One ``ways``-way one-shot episode over image indices of a labelled set.

    ``enrolled[j]`` and ``queries[j]`` are drawings of the same character (class
    ``classes[j]``) by drawers ``enrolled_drawer`` and ``query_drawer``; query ``j`` is
    correct when its nearest enrolled drawing is ``enrolled[j]``.
    """

    alphabet: str
    classes: np.ndarray  # int64 (ways,), distinct labels of one alphabet
    enrolled: np.ndarray  # int64 (ways,) image indices
    queries: np.ndarray  # int64 (ways,) image indices
    enrolled_drawer: int
    query_drawer: int


def build_one_shot_episodes(
    labels: np.ndarray,
    drawers: np.ndarray,
    class_alphabets: Sequence[str],
    episodes_per_alphabet: int = 20,
    ways: int = ONE_SHOT_WAYS,
    seed: int = 0,
) -> list[OneShotEpisode]:
    """``episodes_per_alphabet`` (default 20) episodes per alphabet, alphabets in order of
    first appearance in ``class_alphabets`` (the alphabet of each label).

    For each episode, drawn from one ``numpy.random.default_rng(seed)`` stream (default seed
    0, so the episodes are a fixed function of the data): ``ways`` (default 20) distinct
    characters of the alphabet, then two distinct drawers among those who drew all of them;
    the first gives the enrolled drawings, the second the queries.
    """
    labels = np.asarray(labels, dtype=np.int64)
    drawers = np.asarray(drawers, dtype=np.int64)
    if labels.shape != drawers.shape or labels.ndim != 1:
        raise ValueError(f"labels {labels.shape} and drawers {drawers.shape} must be equal 1-D")
    if episodes_per_alphabet < 1 or ways < 2:
        raise ValueError(
            f"need episodes_per_alphabet >= 1 and ways >= 2, got {episodes_per_alphabet}, {ways}"
        )
    image_of = {(int(c), int(d)): i for i, (c, d) in enumerate(zip(labels, drawers, strict=True))}
    drawers_of: dict[int, set[int]] = {}
    for c, d in image_of:
        drawers_of.setdefault(c, set()).add(d)
    rng = np.random.default_rng(seed)
    episodes = []
    for alphabet in dict.fromkeys(class_alphabets):
        classes = np.array(
            [c for c, a in enumerate(class_alphabets) if a == alphabet], dtype=np.int64
        )
        if classes.size < ways:
            raise ValueError(
                f"alphabet {alphabet!r} has {classes.size} characters, fewer than {ways} ways"
            )
        for _ in range(episodes_per_alphabet):
            chosen = rng.choice(classes, size=ways, replace=False)
            common = set.intersection(*(drawers_of.get(int(k), set()) for k in chosen))
            if len(common) < 2:
                raise ValueError(f"alphabet {alphabet!r}: fewer than two common drawers")
            first, second = rng.choice(sorted(common), size=2, replace=False)
            episodes.append(
                OneShotEpisode(
                    alphabet=alphabet,
                    classes=chosen,
                    enrolled=np.array([image_of[(int(k), int(first))] for k in chosen]),
                    queries=np.array([image_of[(int(k), int(second))] for k in chosen]),
                    enrolled_drawer=int(first),
                    query_drawer=int(second),
                )
            )
    return episodes
