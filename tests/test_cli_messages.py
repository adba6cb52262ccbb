"""Every ``--flag`` an error or warning message suggests exists on each command that can print
it (``embed`` used to suggest ``--max-image-pixels``, which only ``pack`` has)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import partialfc
from partialfc.cli import COMMANDS, command_parser

PACKAGE = Path(partialfc.__file__).resolve().parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]")
MESSAGE_CALLS = {"print", "warn", "warning", "error", "say", "log", "fail"}


def _module_file(name: str) -> Path | None:
    parts = name.split(".")[1:]
    for candidate in (
        PACKAGE.joinpath(*parts).with_suffix(".py"),
        PACKAGE.joinpath(*parts, "__init__.py"),
    ):
        if candidate.is_file():
            return candidate
    return None


def _imports(name: str, tree: ast.AST) -> set[str]:
    """partialfc modules ``name`` imports, at any depth of its code (lazy imports included)."""
    package = name if _module_file(name).name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("partialfc") and _module_file(m) is not None}


# Library messages about an option that only the commands with that option can reach (the
# function raising them is called with the option's value): checked against those commands.
ON_THE_OPTION_PATH = {
    ("partialfc.backbone.devices", "--device"),  # parse_device(args.device)
    ("partialfc.deploy.export", "--opset"),  # export_checkpoint(opset=args.opset)
    ("partialfc.detect.deploy", "--detect"),  # only under args.detect
    ("partialfc.detect.command", "--detect"),  # aligned_copy: pack --detect
    ("partialfc.detect.command", "--scrfd-size"),  # detector_from_args: --detect/--detector
    ("partialfc.detect.command", "--scrfd-threshold"),  # detector_from_args, likewise
    ("partialfc.deploy.verify", "--allow-other-model"),  # check_threshold_model: --threshold
}
CROSS_REFERENCE = re.compile(r"partialfc ([a-z]+) (--[a-z][a-z0-9-]*[a-z0-9])")


def _suggested_flags(tree: ast.AST, module: str) -> set[tuple[str, str | None, str | None]]:
    """``(flag, command named in the message or None, function it is raised in)`` for the
    strings of ``raise`` statements and of message calls (print, warn, ...)."""
    found = set()

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        holder = isinstance(node, ast.Raise)
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            holder = called in MESSAGE_CALLS
        if holder:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
                    named = {flag: cmd for cmd, flag in CROSS_REFERENCE.findall(inner.value)}
                    for flag in FLAG.findall(inner.value):
                        found.add((flag, named.get(flag), function))
            return
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def _reach(module: str) -> dict[str, set]:
    """``{module: suggested flags}`` for ``module`` and everything it imports."""
    seen, todo = {}, [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        tree = ast.parse(_module_file(name).read_text())
        seen[name] = _suggested_flags(tree, name)
        todo += sorted(_imports(name, tree) - set(seen))
    return seen


def _options(command: str) -> set[str]:
    parser = command_parser(command)
    return {s for action in parser._actions for s in action.option_strings}


def _served(module: str) -> set[str]:
    return {name for name, (path, _) in COMMANDS.items() if path == module}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_suggested_flag_exists_on_the_command(command):
    own = COMMANDS[command][0]
    options = _options(command)
    missing = set()
    for module, flags in _reach(own).items():
        served = _served(module)
        for flag, named, function in flags:
            if named is not None:  # "partialfc verify --calibrate": the flag of that command
                if flag not in _options(named):
                    missing.add(f"{module}: partialfc {named} {flag}")
                continue
            if served and function and function.strip("_") in served:
                if function.strip("_") != command:
                    continue  # raised in another command's function of a shared module
            if (module, flag) in ON_THE_OPTION_PATH and flag not in options:
                continue
            if flag not in options:
                missing.add(f"{module} ({function}): {flag}")
    assert not missing, f"partialfc {command} can print flags it does not have: {sorted(missing)}"


def test_the_check_finds_a_flag_the_command_lacks():
    """The message ``embed`` printed for a huge image named ``--max-image-pixels``."""
    tree = ast.parse("def f():\n    raise ValueError('x (set it or --max-image-pixels)')\n")
    assert _suggested_flags(tree, "m") == {("--max-image-pixels", None, "f")}
    assert "--max-image-pixels" not in _options("embed")
    assert "--max-image-pixels" in _options("pack")
