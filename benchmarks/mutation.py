"""Mutation testing of the numeric core with mutmut 3 (slow; not part of CI).

    python benchmarks/mutation.py                      # the default round (see DEFAULT_ROUND)
    python benchmarks/mutation.py losses/margins       # one module
    python benchmarks/mutation.py all                  # every module in MODULES
    python benchmarks/mutation.py --list               # module names

Each module is run as ``mutmut run --max-children N "<dotted module>.*"`` from the repository
root, with the ``[tool.mutmut]`` table of pyproject.toml (which files may be mutated, which test
files are the pool). mutmut records which of those tests execute each function and runs only
those against that function's mutants, so every module gets the smallest subset that reaches it.
The run is niced, single-threaded (``OMP_NUM_THREADS=1``) and uses one worker unless told
otherwise. Mutated copies live under ``mutants/`` (git-ignored).

Afterwards the per-mutant verdicts are read from ``mutants/<path>.meta`` and merged into the JSON
summary (default ``benchmarks/results/mutation.json``) under ``modules[<name>][<label>]``:
total, killed, survived, timeout, no_tests, other, and the surviving mutant ids. ``--label
before`` records a baseline next to the current (``after``) numbers. ``--summarize-only``
rewrites the summary from the verdicts already on disk without running anything.
``--rerun-survivors before`` runs only the mutants that survived under that label (valid when
the module's source is unchanged and tests were only added: a killed mutant stays killed) and
records the updated counts. A re-run stopped part way can still be recorded with
``--summarize-only --rerun-survivors LABEL``: survivors it did not reach stay counted as
surviving and their number is stored as ``not_rerun``. ``--unchecked`` continues a run that was
stopped part way: it runs only the mutants without a verdict in ``mutants/<path>.meta``; with
``--rerun-survivors LABEL`` it also re-runs that label's survivors, and the counts are read
from the verdicts on disk.

mutmut re-records which tests reach which function only for tests it has not seen; after
editing an existing test (same test id) pass ``--fresh-stats`` so the edit counts.

Show one mutant with ``mutmut show <id>``; list the tests that run for it with
``mutmut tests-for-mutant <id>``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: short name -> source file. The order is the order of ``all``.
MODULES = {
    "losses/margins": "partialfc/losses/margins.py",
    "losses/margin_softmax": "partialfc/losses/margin_softmax.py",
    "classifier/sampling": "partialfc/classifier/sampling.py",
    "classifier/optim": "partialfc/classifier/optim.py",
    "classifier/partial_fc": "partialfc/classifier/partial_fc.py",
    "eval/roc": "partialfc/eval/roc.py",
    "eval/tar_at_far": "partialfc/eval/tar_at_far.py",
    "eval/identification": "partialfc/eval/identification.py",
    "data/recordio": "partialfc/data/recordio.py",
    "eval/accuracy": "partialfc/eval/accuracy.py",
    "eval/paired": "partialfc/eval/paired.py",
}
DEFAULT_ROUND = [
    "losses/margins",
    "losses/margin_softmax",
    "classifier/sampling",
    "classifier/optim",
    "classifier/partial_fc",
    "eval/roc",
]

# mutmut 3 exit-code conventions (mutmut.stats.status_by_exit_code)
_KILLED = {1, 3}
_SURVIVED = {0}
_TIMEOUT = {36, 24, -24, 152, 255}
_NO_TESTS = {5, 33}


def dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def summarize(path: str) -> dict:
    """Counts and survivor ids of one source file, from mutmut's verdict file."""
    meta = REPO / "mutants" / (path + ".meta")
    if not meta.exists():
        raise FileNotFoundError(f"{meta} not found: run the module first")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    out = {"total": len(codes), "killed": 0, "survived": 0, "timeout": 0, "no_tests": 0}
    other, survivors, unchecked = 0, [], 0
    for key, code in sorted(codes.items()):
        if code is None:
            unchecked += 1
        elif code in _KILLED:
            out["killed"] += 1
        elif code in _SURVIVED:
            out["survived"] += 1
            survivors.append(key)
        elif code in _TIMEOUT:
            out["timeout"] += 1
        elif code in _NO_TESTS:
            out["no_tests"] += 1
            survivors.append(key)  # nothing ran against it: as bad as a survivor
        else:
            other += 1
    out["other"] = other
    if unchecked:
        out["not_checked"] = unchecked
    out["survivors"] = survivors
    return out


def rerun_counts(path: str, previous: dict) -> dict:
    """Counts after re-running ``previous['survivors']``: the other mutants keep their verdict."""
    meta = REPO / "mutants" / (path + ".meta")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    out = {k: previous[k] for k in ("total", "killed", "survived", "timeout", "no_tests")}
    out["other"] = previous.get("other", 0)
    if previous.get("not_checked"):  # a partial baseline stays partial
        out["not_checked"] = previous["not_checked"]
    out["survived"] = out["no_tests"] = 0
    survivors, not_rerun = [], 0
    for key in previous["survivors"]:
        code = codes.get(key)
        if code is None:  # the re-run was stopped before this one: still counted as surviving
            not_rerun += 1
            code = 0
        if code in _KILLED:
            out["killed"] += 1
        elif code in _TIMEOUT:
            out["timeout"] += 1
        elif code in _NO_TESTS:
            out["no_tests"] += 1
            survivors.append(key)
        elif code in _SURVIVED:
            out["survived"] += 1
            survivors.append(key)
        else:
            out["other"] += 1
    out["survivors"] = survivors
    out["rerun_of"] = len(previous["survivors"])
    if not_rerun:
        out["not_rerun"] = not_rerun
    return out


def unchecked_names(path: str) -> list[str]:
    """Ids of the mutants of ``path`` that have no verdict yet (a run stopped part way)."""
    meta = REPO / "mutants" / (path + ".meta")
    if not meta.exists():
        raise FileNotFoundError(f"{meta} not found: run the module first")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(key for key, code in codes.items() if code is None)


def run_module(path: str, max_children: int, niceness: int, names=None) -> int:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.setdefault("PARTIALFC_SHARED_DATA", str(REPO.parent / "shared" / "data"))
    mutmut = Path(sys.executable).with_name("mutmut")
    cmd = [str(mutmut) if mutmut.exists() else "mutmut", "run"]
    cmd += ["--max-children", str(max_children), *(names or [dotted(path) + ".*"])]
    if niceness:
        cmd = ["nice", "-n", str(niceness), *cmd]
    shown = cmd if len(cmd) < 12 else [*cmd[:8], f"... ({len(cmd) - 8} mutant ids)"]
    print("+", " ".join(shown), flush=True)
    # mutmut draws a progress spinner on stdout; keep only its final lines
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr).replace("\r", "\n").strip().splitlines()[-25:]
    print("\n".join(tail), flush=True)
    return proc.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("modules", nargs="*", help="short names (see --list), or 'all'")
    ap.add_argument("--list", action="store_true", help="print the module names and exit")
    ap.add_argument("--max-children", type=int, default=1, help="mutmut workers (default 1)")
    ap.add_argument("--nice", type=int, default=19, help="niceness of the run (default 19)")
    ap.add_argument("--label", default="after", help="key the counts are stored under")
    ap.add_argument("--output", type=Path, default=REPO / "benchmarks/results/mutation.json")
    ap.add_argument(
        "--summarize-only", action="store_true", help="only re-read the verdicts on disk"
    )
    ap.add_argument(
        "--fresh-stats",
        action="store_true",
        help="forget which tests reach which function (needed after editing existing tests)",
    )
    ap.add_argument(
        "--rerun-survivors",
        metavar="LABEL",
        help="run only the survivors recorded under LABEL (source unchanged, tests added)",
    )
    ap.add_argument(
        "--unchecked",
        action="store_true",
        help="run only the mutants without a verdict yet (continue a stopped run)",
    )
    args = ap.parse_args(argv)

    if args.list:
        for name, path in MODULES.items():
            print(f"{name:24s} {path}{'' if name in DEFAULT_ROUND else '   (not in default)'}")
        return 0
    names = args.modules or DEFAULT_ROUND
    if names == ["all"]:
        names = list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; choose from {list(MODULES)} or 'all'")

    if args.fresh_stats:
        (REPO / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    summary = json.loads(args.output.read_text()) if args.output.exists() else {}
    summary.setdefault("tool", "mutmut")
    summary.setdefault("modules", {})
    status = 0
    for name in names:
        path = MODULES[name]
        previous = None
        if args.rerun_survivors:
            previous = summary["modules"][name][args.rerun_survivors]
            if not previous["survivors"]:
                counts = dict(previous)
        if not args.summarize_only and not (previous and not previous["survivors"]):
            names_to_run = previous["survivors"] if previous else None
            if args.unchecked:  # with --rerun-survivors: those survivors and the unchecked
                unchecked = unchecked_names(path)
                print(f"{name}: {len(unchecked)} mutants without a verdict", flush=True)
                names_to_run = (names_to_run or []) + unchecked
            if names_to_run == []:  # --unchecked with every verdict on disk: nothing to run
                rc = 0
            else:
                rc = run_module(path, args.max_children, args.nice, names_to_run)
            if rc != 0:
                print(f"mutmut failed on {name} (exit {rc})", file=sys.stderr)
                status = 1
                continue
        if previous is None or args.unchecked:  # every verdict on disk is current
            counts = summarize(path)
        elif previous["survivors"]:
            counts = rerun_counts(path, previous)
        counts["date"] = dt.date.today().isoformat()
        entry = summary["modules"].setdefault(name, {"path": path})
        entry[args.label] = counts
        print(
            f"{name}: {counts['total']} mutants, {counts['killed']} killed, "
            f"{counts['survived']} survived, {counts['timeout']} timeout, "
            f"{counts['no_tests']} without tests",
            flush=True,
        )
    summary["tool"] = f"mutmut {_mutmut_version()}"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2) + "\n")
    return status


def _mutmut_version() -> str:
    try:
        from importlib.metadata import version

        return version("mutmut")
    except Exception:  # noqa: BLE001 - only a label
        return "?"


if __name__ == "__main__":
    sys.exit(main())
