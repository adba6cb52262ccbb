"""One-shot accuracy on held-out background alphabets: a hand count and a brute-force recount."""

import numpy as np
import pytest

from partialfc.data.loaders import load_omniglot
from partialfc.data.omniglot_holdout import OneShotEpisode, build_one_shot_episodes
from partialfc.eval.protocols import OmniglotHoldout
from partialfc.eval.protocols.omniglot import episode_ranks


def _unit(degrees):
    r = np.deg2rad(np.asarray(degrees, dtype=np.float64))
    return np.stack([np.cos(r), np.sin(r)], axis=1).astype(np.float32)


def _episode(enrolled, queries):
    return OneShotEpisode(
        alphabet="toy",
        classes=np.arange(len(enrolled)),
        enrolled=np.array(enrolled),
        queries=np.array(queries),
        enrolled_drawer=1,
        query_drawer=2,
    )


def test_one_shot_accuracy_on_hand_made_embeddings_equals_a_hand_count():
    # images 0-2 enrolled at 0, 120, 240 degrees; their queries (3-5) at 10, 250, 200 degrees:
    # query 3 is nearest to 0 (hit); query 4 (class of 120) is nearest to 240, then 0, then
    # 120 (rank 3); query 5 is nearest to 240 (hit). Second episode: enrolled 3, 4 (10, 250
    # degrees), queries 0 (at 0, nearest 10: hit) and 2 (at 240, nearest 250: hit)
    emb = _unit([0, 120, 240, 10, 250, 200])
    episodes = [_episode([0, 1, 2], [3, 4, 5]), _episode([3, 4], [0, 2])]
    ranks = episode_ranks(emb, episodes)
    np.testing.assert_array_equal(ranks, [1, 3, 1, 1, 1])
    assert np.mean(ranks == 1) == 4 / 5


def test_a_tie_counts_against_the_query():
    emb = _unit([0, 90, 45])  # query 2 is equally close to both enrolled drawings
    (rank,) = episode_ranks(emb, [_episode([0, 1], [2, 2])])[:1]
    assert rank == 2


def _hashed_embed(images):
    """A fixed, image-dependent embedding: a random projection of the pixels."""
    flat = images.reshape(len(images), -1).astype(np.float64)
    projection = np.random.default_rng(7).normal(size=(flat.shape[1], 16))
    return (flat @ projection).astype(np.float32)


def test_protocol_accuracy_equals_a_brute_force_count():
    alphabets = ["Alphabet_of_the_Magi", "Greek"]  # 20 and 24 characters: 880 drawings
    protocol = OmniglotHoldout(alphabets, episodes_per_alphabet=3, fars=(1e-3,))
    one_shot, pairs = protocol.run(_hashed_embed)

    data = load_omniglot("background", alphabets=alphabets)
    emb = _hashed_embed(data.images)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    hits = trials = 0
    for e in build_one_shot_episodes(data.labels, data.drawers, data.alphabets, 3):
        for j, query in enumerate(e.queries):
            nearest = max(range(20), key=lambda k: float(emb[query] @ emb[e.enrolled[k]]))
            hits += nearest == j
            trials += 1
    assert trials == 2 * 3 * 20 == one_shot.cmc.n_probes
    assert one_shot.cmc.hits[0] == hits
    assert one_shot.name == "omniglot_holdout_one_shot_20way_28"
    assert 0 < hits < trials  # neither trivial nor hopeless
    assert pairs.name == "omniglot_holdout_open_set_28"
    assert pairs.n_genuine == 44 * 190
    assert pairs.n_genuine + pairs.n_impostor == 880 * 879 // 2


def test_the_eval_command_refuses_a_bad_holdout_naming_the_option():
    import argparse

    from partialfc.eval.command import add_arguments, build_protocols

    parser = argparse.ArgumentParser()
    add_arguments(parser, "eval")
    args = parser.parse_args(["m.onnx", "--out", "o", "--omniglot-holdout", "Angelic"])
    with pytest.raises(ValueError, match="--omniglot-holdout: 'Angelic' is an evaluation"):
        build_protocols(args)
    args = parser.parse_args(["m.onnx", "--out", "o", "--omniglot-holdout", "N_Ko, Tifinagh"])
    (protocol,) = build_protocols(args)
    assert protocol.alphabets == ["N_Ko", "Tifinagh"]
    args = parser.parse_args(["m.onnx", "--out", "o", "--omniglot-holdout", "2"])
    assert build_protocols(args)[0].alphabets == ["Sanskrit", "Tifinagh"]


def test_the_protocol_table_builds_it_from_its_argument():
    from partialfc.eval.protocols import build_protocol

    protocol = build_protocol("omniglot_holdout:N_Ko,Tifinagh", size=56)
    assert protocol.alphabets == ["N_Ko", "Tifinagh"] and protocol.size == 56
    assert protocol.flip is False
    with pytest.raises(ValueError, match="omniglot_holdout:0: 0 holds out no alphabet"):
        build_protocol("omniglot_holdout:0")
    with pytest.raises(ValueError, match="needs the held-out alphabets"):
        build_protocol("omniglot_holdout")
