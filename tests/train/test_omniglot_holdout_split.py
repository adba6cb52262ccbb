"""data.holdout_background_alphabets: held-out characters never reach training; bad values are
refused naming the key; the omniglot_holdout protocol is built from the config."""

import numpy as np
import pytest

from partialfc.data.loaders import load_omniglot
from partialfc.train.config import ConfigError, load_config
from partialfc.train.data import build_train_set, holdout_alphabets
from partialfc.train.evaluation import build_protocols

PRESET = "configs/omniglot_select.yaml"
LAST_FIVE = ["Mkhedruli_(Georgian)", "Burmese_(Myanmar)", "N_Ko", "Sanskrit", "Tifinagh"]


def _image_keys(images: np.ndarray) -> set[bytes]:
    return {image.tobytes() for image in images}


def test_no_held_out_character_reaches_training():
    cfg = load_config(PRESET)
    assert holdout_alphabets(cfg.data) == LAST_FIVE
    train = build_train_set(cfg.data)
    full = load_omniglot("background")
    # the training classes are exactly the background classes of the other 25 alphabets
    kept = [n for n, a in zip(full.class_names, full.alphabets, strict=True) if a not in LAST_FIVE]
    assert train.num_classes == len(kept) == 964 - 205
    held = load_omniglot("background", alphabets=LAST_FIVE)
    train_keys = _image_keys(train.images)
    assert len(train) == 20 * len(kept)
    assert not _image_keys(held.images) & train_keys  # no held-out drawing is trained on
    # every kept drawing is trained on, under its own class
    rest = load_omniglot("background", exclude_alphabets=LAST_FIVE)
    assert rest.class_names == kept
    np.testing.assert_array_equal(train.images, rest.images)
    np.testing.assert_array_equal(train.labels, rest.labels)


def test_the_integer_form_holds_out_the_same_alphabets():
    cfg = load_config(PRESET, ["data.holdout_background_alphabets=5"])
    assert holdout_alphabets(cfg.data) == LAST_FIVE


def test_default_trains_on_all_964_classes():
    cfg = load_config("configs/omniglot_cpu.yaml", ["data.rotation_classes=1"])
    assert cfg.data.holdout_background_alphabets == 0 and holdout_alphabets(cfg.data) == []
    full = load_omniglot("background")
    train = build_train_set(cfg.data)
    assert train.num_classes == 964
    np.testing.assert_array_equal(train.images, full.images)
    rotated = build_train_set(load_config("configs/omniglot_cpu.yaml").data)  # the main job
    assert rotated.num_classes == 4 * 964 and len(rotated) == 4 * len(full.images)


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.holdout_background_alphabets=[Klingon]", "'Klingon' is not an Omniglot alphabet"),
        ("data.holdout_background_alphabets=[Angelic]", "'Angelic' is an evaluation alphabet"),
        ("data.holdout_background_alphabets=27", r"must be an integer in \[0, 26\]"),
        ("data.holdout_background_alphabets=-1", r"must be an integer in \[0, 26\]"),
        ("data.holdout_background_alphabets=[Tagalog]", "'Tagalog' has 17 characters"),
        ("data.holdout_background_alphabets=2.5", "expected int | list"),
    ],
)
def test_bad_holdout_values_name_the_key(override, message):
    with pytest.raises(ConfigError, match=r"data\.holdout_background_alphabets") as err:
        load_config(PRESET, [override])
    assert err.match(message)


def test_holdout_protocol_needs_held_out_alphabets():
    with pytest.raises(ConfigError, match=r"eval\.protocols\[0\]: omniglot_holdout .*set data\."):
        load_config(PRESET, ["data.holdout_background_alphabets=0"])
    with pytest.raises(ValueError, match=r"data\.holdout_background_alphabets"):
        build_protocols(["omniglot_holdout"], 28, False, 512)
    (protocol,) = build_protocols(["omniglot_holdout"], 28, None, None, LAST_FIVE)
    assert protocol.alphabets == LAST_FIVE and protocol.size == 28
    assert protocol.flip is False and protocol.batch_size == 256  # the table's defaults


def test_an_explicit_holdout_argument_must_be_the_held_out_set():
    cfg = load_config(PRESET, ["eval.protocols=[omniglot_holdout:5]"])
    assert cfg.eval.protocols == ["omniglot_holdout:5"]
    with pytest.raises(ConfigError, match=r"eval\.protocols\[0\]: 'omniglot_holdout:4' is not"):
        load_config(PRESET, ["eval.protocols=[omniglot_holdout:4]"])
    with pytest.raises(ConfigError, match=r"eval\.protocols\[1\]: 'Angelic' is an evaluation"):
        load_config(PRESET, ["eval.protocols=[omniglot_one_shot, 'omniglot_holdout:Angelic']"])


def test_holdout_needs_omniglot_data():
    with pytest.raises(ConfigError, match="data.holdout_background_alphabets needs data.source"):
        load_config(PRESET, ["data.source=npz", "data.path=x.npz", "eval.protocols=[]"])
