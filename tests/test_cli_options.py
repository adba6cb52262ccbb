"""Numeric command-line options are range-checked before any file is read, naming the option."""

from __future__ import annotations

import pytest

from partialfc.cli import main

CASES = [
    (
        ["eval", "nowhere", "--out", "o", "--omniglot", "--batch-size", "0"],
        2,
        "--batch-size must be an integer >= 1, got 0",
    ),
    (
        ["clean", "nowhere", "--out", "o", "--batch-size", "-4"],
        1,
        "--batch-size must be an integer >= 1, got -4",
    ),
    (
        ["clean", "nowhere", "--out", "o", "--threshold-deg", "200"],
        1,
        "--threshold-deg must be a finite number in (0, 180], got 200.0",
    ),
    (
        ["distill", "--teacher", "t", "--config", "c.yaml", "--temperature", "0"],
        2,
        "--temperature must be a finite number > 0, got 0.0",
    ),
    (
        ["distill", "--teacher", "t", "--config", "c.yaml", "--kl-weight", "inf"],
        2,
        "--kl-weight must be a finite number >= 0, got inf",
    ),
    (
        ["invert", "nowhere", "--out", "o", "--centers", "c.npy", "--steps", "0"],
        2,
        "--steps must be an integer >= 1, got 0",
    ),
    (
        ["invert", "nowhere", "--out", "o", "--centers", "c.npy", "--lr", "nan"],
        2,
        "--lr must be a finite number > 0, got nan",
    ),
    (
        ["invert", "nowhere", "--out", "o", "--centers", "c.npy", "--seed", "-1"],
        2,
        "--seed must be an integer in [0, 4294967295], got -1",
    ),
    (
        ["pack", "nowhere", "x.rec", "--quality", "101"],
        2,
        "--quality must be an integer in [0, 100], got 101",
    ),
    (["pack", "nowhere", "x.rec", "--workers", "0"], 2, "--workers must be an integer >= 1, got 0"),
    (
        ["pack", "nowhere", "x.rec", "--resize", "-112"],
        2,
        "--resize must be an integer >= 1, got -112",
    ),
]


@pytest.mark.parametrize("args, code, message", CASES, ids=[" ".join(c[0][-2:]) for c in CASES])
def test_out_of_range_option_is_named_before_anything_is_read(args, code, message, capsys):
    assert main(args) == code
    assert capsys.readouterr().err == f"partialfc {args[0]}: {message}\n"
