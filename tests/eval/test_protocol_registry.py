"""One protocol table for ``partialfc eval`` and the training config: same names, same defaults."""

import argparse
import dataclasses

import pytest

from partialfc.eval.command import add_arguments, build_protocols, protocol_specs
from partialfc.eval.protocols import Ijb, LfwPairs, OmniglotOpenSet, Orl, VerificationBin
from partialfc.eval.protocols.registry import PROTOCOLS, build_protocol, parse_protocol
from partialfc.train.config import ConfigError, load_config
from partialfc.train.evaluation import Evaluator

EVERY_FLAG = [
    "model",
    "--out",
    "report",
    "--bin",
    "lfw.bin",
    "--lfw-pairs",
    "pairs.txt",
    "--lfw-images",
    "images",
    "--lfw-dev",
    "--omniglot",
    "--omniglot-one-shot",
    "--omniglot-holdout",
    "5",
    "--orl",
    "--ijb",
    "ijb_root",
    "--omniglot-size",
    "112",
]


def _cli(argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser, "eval")
    return parser.parse_args(argv)


def _trained(specs, *overrides):
    cfg = load_config(
        overrides=[
            "data.source=omniglot",
            "data.input_size=112",
            "data.holdout_background_alphabets=5",
            f"eval.protocols={specs}",
        ]
        + list(overrides)
    )
    return Evaluator.from_names(
        cfg.eval.protocols, cfg.data.input_size, cfg.eval.flip_test, cfg.eval.batch_size
    ).protocols


def _described(protocols):
    return [(type(p).__name__, vars(p)) for p in protocols]


@pytest.mark.parametrize(
    "cli_extra, config_extra",
    [
        ([], []),
        (["--no-flip", "--batch-size", "64"], ["eval.flip_test=false", "eval.batch_size=64"]),
        (["--ijb-name", "IJBB"], []),
    ],
)
def test_the_command_and_the_training_config_build_the_same_protocols(cli_extra, config_extra):
    args = _cli(EVERY_FLAG + cli_extra)
    specs = protocol_specs(args)
    from_cli = build_protocols(args)
    assert _described(from_cli) == _described(_trained(specs, *config_extra))
    # every protocol of the table can be asked for from the command line
    seen = {parse_protocol(s)[0].name for s in specs} | {"ijbb" if "IJBB" in cli_extra else "ijbc"}
    assert seen | {"ijbb", "ijbc"} == set(PROTOCOLS)


def test_the_table_defaults_are_what_the_protocols_get():
    by_name = {
        spec: build_protocol(spec)
        for spec in ("omniglot_open_set", "orl", "lfw_dev", "bin:a.bin", "ijbc:root")
    }
    assert isinstance(by_name["omniglot_open_set"], OmniglotOpenSet)
    assert by_name["omniglot_open_set"].flip is False  # a mirrored character is another one
    assert by_name["omniglot_open_set"].size == 28
    assert isinstance(by_name["orl"], Orl) and by_name["orl"].flip is True
    assert isinstance(by_name["lfw_dev"], LfwPairs) and by_name["lfw_dev"].flip is True
    assert isinstance(by_name["bin:a.bin"], VerificationBin)
    assert str(by_name["bin:a.bin"].path) == "a.bin"
    ijb = by_name["ijbc:root"]
    assert isinstance(ijb, Ijb) and (ijb.name, ijb.size, ijb.flip) == ("IJBC", 112, True)
    assert {p.batch_size for p in by_name.values()} == {256}
    assert build_protocol("omniglot_open_set", flip=True, batch_size=7, size=56).size == 56
    assert build_protocol("lfw_dev", size=56).batch_size == 256  # size: only sized protocols


def test_the_command_takes_the_omniglot_size_from_the_table(monkeypatch):
    kind = PROTOCOLS["omniglot_open_set"]
    monkeypatch.setitem(PROTOCOLS, kind.name, dataclasses.replace(kind, size=56))
    (protocol,) = build_protocols(_cli(["model", "--out", "report", "--omniglot"]))
    assert protocol.size == 56
    args = _cli(["model", "--out", "report", "--omniglot", "--omniglot-size", "105"])
    assert build_protocols(args)[0].size == 105


@pytest.mark.parametrize(
    "override, message",
    [
        ("eval.protocols=[omniglot_open_st]", r"eval.protocols\[0\]: unknown protocol"),
        ("eval.protocols=[lfw_dev, bin]", r"eval.protocols\[1\]: protocol 'bin' needs an arg"),
        ("eval.protocols=[lfw_dev:x]", r"eval.protocols\[0\]: protocol 'lfw_dev' takes no arg"),
        ("eval.batch_size=0", "eval.batch_size must be null or an integer >= 1, got 0"),
    ],
)
def test_a_bad_protocol_in_the_config_is_an_error_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=["data.source=omniglot", override])
