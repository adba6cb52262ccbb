"""Held-out background alphabets: which ones, and the one-shot episodes built on them."""

import numpy as np
import pytest

from partialfc.data.loaders import load_omniglot
from partialfc.data.omniglot_holdout import (
    build_one_shot_episodes,
    holdout_candidates,
    resolve_holdout_alphabets,
)

LAST_FIVE = ["Mkhedruli_(Georgian)", "Burmese_(Myanmar)", "N_Ko", "Sanskrit", "Tifinagh"]


def test_candidates_are_the_background_alphabets_with_20_characters_in_file_order():
    with np.load(
        load_omniglot.__globals__["BUNDLED_OMNIGLOT"] / "omniglot_28.npz", allow_pickle=False
    ) as data:
        names, alphabet, background = (
            data["alphabet_names"],
            data["alphabet"],
            data["is_background"],
        )
        expected = [
            str(names[a]) for a in range(len(names)) if (background & (alphabet == a)).sum() >= 20
        ]
    candidates = holdout_candidates()
    assert candidates == expected and len(candidates) == 26
    assert resolve_holdout_alphabets(5) == LAST_FIVE == candidates[-5:]
    assert resolve_holdout_alphabets(0) == []
    assert resolve_holdout_alphabets(["Greek", "Latin"]) == ["Greek", "Latin"]


@pytest.mark.parametrize(
    "spec, message",
    [
        (27, r"integer in \[0, 26\].*got 27"),
        (-1, r"integer in \[0, 26\].*got -1"),
        (["Klingon"], "'Klingon' is not an Omniglot alphabet"),
        (["Angelic"], "'Angelic' is an evaluation alphabet"),
        (["Tagalog"], "'Tagalog' has 17 characters"),
        (["Greek", "Greek"], "'Greek' is named twice"),
        ("Greek", "an integer or a list"),
        (True, "an integer or a list"),
    ],
)
def test_bad_holdout_specs_are_refused(spec, message):
    with pytest.raises(ValueError, match=message):
        resolve_holdout_alphabets(spec)


def test_load_omniglot_selects_and_excludes_alphabets():
    held = load_omniglot("background", alphabets=LAST_FIVE)
    rest = load_omniglot("background", exclude_alphabets=LAST_FIVE)
    full = load_omniglot("background")
    assert held.num_classes == 41 + 34 + 33 + 42 + 55 == 205
    assert rest.num_classes == 964 - 205
    assert set(held.alphabets) == set(LAST_FIVE) and not set(rest.alphabets) & set(LAST_FIVE)
    np.testing.assert_array_equal(held.labels, np.repeat(np.arange(205), 20))
    np.testing.assert_array_equal(held.drawers, np.tile(np.arange(1, 21), 205))
    # the two parts are the full set, split by class, in the file's class order
    in_held = np.isin(np.array(full.alphabets), LAST_FIVE)
    np.testing.assert_array_equal(
        held.images, full.images.reshape(964, 20, 28, 28)[in_held].reshape(-1, 28, 28)
    )
    np.testing.assert_array_equal(
        rest.images, full.images.reshape(964, 20, 28, 28)[~in_held].reshape(-1, 28, 28)
    )
    with pytest.raises(ValueError, match="'Angelic' is not an alphabet of the Omniglot background"):
        load_omniglot("background", exclude_alphabets=["Angelic"])


def test_episodes_are_20_characters_of_one_alphabet_two_drawers_and_reproducible():
    data = load_omniglot("background", alphabets=["N_Ko", "Tifinagh"])
    episodes = build_one_shot_episodes(data.labels, data.drawers, data.alphabets)
    assert len(episodes) == 2 * 20
    assert [e.alphabet for e in episodes] == ["N_Ko"] * 20 + ["Tifinagh"] * 20
    for e in episodes:
        assert len(set(e.classes.tolist())) == 20
        assert {data.alphabets[c] for c in e.classes} == {e.alphabet}
        assert e.enrolled_drawer != e.query_drawer
        np.testing.assert_array_equal(data.labels[e.enrolled], e.classes)
        np.testing.assert_array_equal(data.labels[e.queries], e.classes)
        assert set(data.drawers[e.enrolled]) == {e.enrolled_drawer}
        assert set(data.drawers[e.queries]) == {e.query_drawer}
    # a fixed function of the data and the seed; another seed gives other episodes
    again = build_one_shot_episodes(data.labels, data.drawers, data.alphabets)
    other = build_one_shot_episodes(data.labels, data.drawers, data.alphabets, seed=1)
    for a, b in zip(episodes, again, strict=True):
        np.testing.assert_array_equal(a.enrolled, b.enrolled)
        np.testing.assert_array_equal(a.queries, b.queries)
    assert any(
        not np.array_equal(a.enrolled, b.enrolled) for a, b in zip(episodes, other, strict=True)
    )
    # the episodes vary: not always the same characters or the same pair of drawers
    assert len({tuple(sorted(e.classes)) for e in episodes}) > 30
    assert len({(e.enrolled_drawer, e.query_drawer) for e in episodes}) > 30


def test_episode_builder_refuses_alphabets_too_small_for_the_ways():
    labels = np.repeat(np.arange(3), 2)
    drawers = np.tile([1, 2], 3)
    with pytest.raises(ValueError, match="alphabet 'a' has 3 characters, fewer than 4 ways"):
        build_one_shot_episodes(labels, drawers, ["a", "a", "a"], ways=4)
    episodes = build_one_shot_episodes(labels, drawers, ["a", "a", "a"], ways=3)
    assert all(sorted(e.classes.tolist()) == [0, 1, 2] for e in episodes)
