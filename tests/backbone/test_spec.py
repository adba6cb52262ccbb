"""``preprocessing.json`` and ``model.json`` are checked against stated ranges when they load,
before anything is allocated from them."""

from __future__ import annotations

import json

import pytest

from partialfc.backbone.io import read_model_config
from partialfc.backbone.spec import PreprocessingSpec

GOOD = PreprocessingSpec(
    model_name="iresnet_small",
    model_kwargs={"embedding_dim": 16, "input_size": 28, "in_channels": 1},
    embedding_dim=16,
    input_size=(28, 28),
    in_channels=1,
    colour_order="GREY",
    mean=(0.5,),
    std=(0.5,),
)


def _spec_file(tmp_path, **changes):
    d = GOOD.to_dict() | changes
    path = tmp_path / "preprocessing.json"
    path.write_text(json.dumps(d))  # json writes NaN and Infinity as Python reads them back
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"input_size": [1000000, 1000000]},
            "input_size[0] must be an integer in [1, 4096], got 1000000",
        ),
        ({"input_size": [28, 0]}, "input_size[1] must be an integer in [1, 4096], got 0"),
        ({"mean": [float("nan")]}, "mean[0] must be a finite number in [-255, 255], got nan"),
        ({"mean": [float("inf")]}, "mean[0] must be a finite number in [-255, 255], got inf"),
        ({"std": [0.0]}, "std[0] must be a finite number in (0, 255], got 0.0"),
        ({"std": [float("nan")]}, "std[0] must be a finite number in (0, 255], got nan"),
        ({"embedding_dim": 0}, "embedding_dim must be an integer in [1, 65536], got 0"),
        ({"embedding_dim": 1e300}, "embedding_dim must be an integer in [1, 65536], got 1"),
        ({"embedding_dim": float("inf")}, "cannot convert float infinity to integer"),
        ({"in_channels": 2}, "in_channels must be 1 or 3, got 2"),
        (
            {"model_kwargs": {"input_size": 10**6, "in_channels": 1}},
            "model_kwargs.input_size must be an integer in [1, 4096], got 1000000",
        ),
    ],
)
def test_out_of_range_specs_are_refused_naming_the_file_and_field(tmp_path, changes, message):
    path = _spec_file(tmp_path, **changes)
    with pytest.raises(ValueError) as err:
        PreprocessingSpec.load(path)
    assert str(err.value).startswith(f"{path}: invalid preprocessing spec: ")
    assert message in str(err.value)


def test_a_spec_in_range_round_trips(tmp_path):
    assert PreprocessingSpec.load(_spec_file(tmp_path)) == GOOD


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_size": 1000000}, "kwargs.input_size must be an integer in [1, 4096], got 1000000"),
        ({"input_size": [112, -1]}, "kwargs.input_size must be an integer in [1, 4096], got -1"),
        ({"embedding_dim": 0}, "kwargs.embedding_dim must be an integer in [1, 65536], got 0"),
        ({"in_channels": 7}, "kwargs.in_channels must be 1 or 3, got 7"),
        ("big", "kwargs: expected a mapping of arguments, got 'big'"),
    ],
)
def test_model_json_is_checked_before_a_network_is_built(tmp_path, kwargs, message):
    """An input size of 10^6 in model.json used to ask the allocator for 64 TB."""
    (tmp_path / "model.json").write_text(json.dumps({"name": "iresnet_small", "kwargs": kwargs}))
    with pytest.raises(ValueError) as err:
        read_model_config(tmp_path)
    assert str(err.value) == f"{tmp_path / 'model.json'}: {message}"


def test_an_embed_with_a_nan_mean_stops_before_embedding(tmp_path, capsys):
    """``embed`` used to embed every image and then report NaN embeddings."""
    from partialfc.cli import main

    _spec_file(tmp_path, mean=[float("nan")])
    assert (
        main(["embed", str(tmp_path), str(tmp_path / "none"), "--out", str(tmp_path / "e.npz")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"partialfc embed: {tmp_path / 'preprocessing.json'}: invalid ")
    assert "mean[0] must be a finite number" in err and "img/s" not in err  # no progress bar
