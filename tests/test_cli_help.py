"""The command line explains itself: ``--version``, a one-sentence top-level help, and every
option's help states its default."""

from __future__ import annotations

import argparse

import pytest

import partialfc
from partialfc.cli import (
    COMMANDS,
    GROUPS,
    DefaultsHelpFormatter,
    build_parser,
    command_groups,
    command_parser,
    main,
)


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"partialfc {partialfc.__version__}\n"


def test_top_level_help_is_one_sentence(capsys):
    assert main(["--help"]) == 0
    description = build_parser().description
    assert description.endswith(".") and description.count(". ") == 0 and "\n" not in description
    out = capsys.readouterr().out
    assert description.split()[0] in out and "``" not in out and "--version" in out


def _parsers(parser: argparse.ArgumentParser):
    """``parser`` and, depth first, the parsers of its subcommands (``gallery enroll`` ...)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _ungrouped() -> set[str]:
    return set(COMMANDS) - {name for names in GROUPS.values() for name in names}


def test_the_help_screen_groups_every_command_by_job(capsys):
    grouped = [name for names in GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped)), "a command sits in two groups"
    assert not _ungrouped(), f"commands without a group: {_ungrouped()}"
    assert list(GROUPS)[:4] == ["train", "evaluate", "deploy", "data"]
    assert GROUPS["migrate"] == ("import-weights", "import-config")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for title, names in GROUPS.items():
        present = [n for n in names if n in COMMANDS]
        if not present:
            assert f"{title}:" not in out  # a group whose commands are not here yet
            continue
        block = out.split(f"\n{title}:\n")[1].split("\n\n")[0].splitlines()
        assert [line.split()[0] for line in block] == present
        for line, name in zip(block, present, strict=True):
            assert line.split(None, 1)[1] == COMMANDS[name][1]  # one line each


def test_a_command_without_a_group_would_be_seen(monkeypatch):
    monkeypatch.setitem(COMMANDS, "orphan", ("partialfc.cli", "not in a group"))
    assert _ungrouped() == {"orphan"} and "orphan" not in command_groups()


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_and_argument_has_help(name):
    empty = [
        f"{parser.prog} {action.option_strings[0] if action.option_strings else action.dest}"
        for parser in _parsers(command_parser(name))
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction) and not (action.help or "").strip()
    ]
    assert not empty, f"without help text: {empty}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_help_states_its_default(name):
    for parser in _parsers(command_parser(name)):
        _check_defaults(parser)


def _check_defaults(parser: argparse.ArgumentParser):
    name = parser.prog
    formatter = DefaultsHelpFormatter(parser.prog)
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        if action.required or action.help == argparse.SUPPRESS:
            continue
        if "default" not in formatter._get_help_string(action).lower():
            missing.append(action.option_strings[0])
    assert not missing, f"{name}: options without a stated default: {missing}"
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


def test_a_command_added_later_lands_in_its_group(monkeypatch):
    monkeypatch.delitem(COMMANDS, "plan", raising=False)
    assert "plan:" not in command_groups()  # no command of the group: no heading
    monkeypatch.setitem(COMMANDS, "plan", ("partialfc.cli", "memory and time of a large run"))
    screen = command_groups()
    assert "\nplan:\n  plan" in screen and screen.index("plan:") > screen.index("data:")
