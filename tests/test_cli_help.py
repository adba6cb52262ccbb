"""The command line explains itself: ``--version``, a one-sentence top-level help, and every
option's help states its default."""

from __future__ import annotations

import argparse

import pytest

import partialfc
from partialfc.cli import COMMANDS, DefaultsHelpFormatter, build_parser, command_parser, main


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"partialfc {partialfc.__version__}\n"


def test_top_level_help_is_one_sentence(capsys):
    assert main(["--help"]) == 0
    description = build_parser().description
    assert description.endswith(".") and description.count(". ") == 0 and "\n" not in description
    out = capsys.readouterr().out
    assert description.split()[0] in out and "``" not in out and "--version" in out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_help_states_its_default(name):
    parser = command_parser(name)
    formatter = DefaultsHelpFormatter(parser.prog)
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        if action.required:
            continue
        if "default" not in formatter._get_help_string(action).lower():
            missing.append(action.option_strings[0])
    assert not missing, f"partialfc {name}: options without a stated default: {missing}"
    parser.format_help()  # every %(default)s expands


def test_defaults_are_rendered_readably():
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--size", type=int, default=112, help="crop side")
    parser.add_argument("--flip", action="store_true", help="flip test")
    parser.add_argument("--out", help="folder")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    text = " ".join(parser.format_help().split())
    assert "crop side (default: 112)" in text
    assert "flip test (default: off)" in text
    assert "folder (default: none)" in text
    assert "cpu (default) or cuda" in text and "cuda (default: cpu)" not in text
