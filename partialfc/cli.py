"""Command-line entry point: ``partialfc <command> ...``.

Each command lives in its own module, which defines ``add_arguments(parser, command)`` and
``run(args) -> int`` (``args.command`` holds the command name, so one module can serve
several). Modules are imported only when their command runs, so ``partialfc --help`` stays
fast and a broken optional dependency only affects the command that needs it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

DESCRIPTION = (
    "Train identity-embedding models with margin-softmax and Partial FC heads, evaluate them "
    "honestly, and use them (export, embed, verify, search a gallery)."
)

# command name -> (module implementing it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "partialfc.train.command",
        "train a backbone + margin/Partial FC head from a YAML config",
    ),
    "eval": (
        "partialfc.eval.command",
        "evaluate a checkpoint or exported model: JSON + Markdown report",
    ),
    "pack": (
        "partialfc.tools.pack_command",
        "pack an image folder or list file into RecordIO .rec/.idx",
    ),
    "unpack": ("partialfc.tools.pack_command", "unpack a RecordIO .rec/.idx into an image folder"),
    "align": ("partialfc.detect.command", "detect and align faces: photos -> 112x112 crops"),
    "export": ("partialfc.deploy.command", "export a trained backbone to ONNX + safetensors"),
    "embed": ("partialfc.deploy.command", "embed a folder of aligned faces or a .rec set"),
    "verify": ("partialfc.deploy.command", "score image pairs with a calibrated threshold"),
    "gallery": (
        "partialfc.deploy.gallery_command",
        "a persistent gallery: gallery enroll | remove | query",
    ),
    "search": (
        "partialfc.deploy.command",
        "older spelling of gallery: search MODEL GALLERY --enroll/--remove/--query",
    ),
    "invert": (
        "partialfc.tools.inversion",
        "synthesize an input from a trained model (model inversion)",
    ),
    "distill": ("partialfc.tools.distillation", "train a small student from a teacher checkpoint"),
    "clean": ("partialfc.tools.cleaning.command", "sub-center cleaning of a noisy training set"),
    "plan": (
        "partialfc.classifier.plan_command",
        "predict a Partial FC run's per-rank memory and bytes per step; does it fit?",
    ),
    "import-weights": (
        "partialfc.tools.arcface_torch.weights_command",
        "turn an arcface_torch backbone (.pth) into a partialfc model directory",
    ),
    "import-config": (
        "partialfc.tools.arcface_torch.config_command",
        "convert an arcface_torch config (.py, read without running it) to a YAML config",
    ),
}

# the help screen's groups, by job, in order: group title -> its commands. A command listed here
# but not (yet) in COMMANDS is left out of the screen; tests/test_cli_help.py checks that every
# command of COMMANDS has exactly one group.
GROUPS: dict[str, tuple[str, ...]] = {
    "train": ("train", "distill"),
    "evaluate": ("eval",),
    "deploy": ("export", "embed", "verify", "gallery", "search"),
    "data": ("pack", "unpack", "align", "clean"),
    "migrate": ("import-weights", "import-config"),  # from arcface_torch
    "plan": ("plan",),
    "research tools": ("invert",),
}

# old command spellings that still run: name -> the note printed on stderr
RENAMED = {
    "search": "`partialfc search` is now `partialfc gallery enroll | remove | query` "
    "(e.g. partialfc gallery enroll MODEL GALLERY INPUT); the old spelling still works",
}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Ends every option's help with its default (``(default: 256)``, ``(default: off)`` for a
    flag, ``(default: none)`` when unset) unless the help already states one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            not action.option_strings
            or action.required
            or action.default is argparse.SUPPRESS
            or "default" in text.lower()
        ):
            return text
        if action.nargs == 0 and isinstance(action.default, bool):  # a flag
            default = "on" if action.default else "off"
        elif action.default is None or action.default == []:
            default = "none"
        else:
            default = "%(default)s"
        return f"{text} (default: {default})" if text else f"default: {default}"


def version() -> str:
    from partialfc import __version__

    return f"partialfc {__version__}"


def command_groups() -> str:
    """The help screen's list of commands: one heading per job, one line per command."""
    width = max(len(name) for name in COMMANDS) + 2
    lines = []
    for title, names in GROUPS.items():
        present = [name for name in names if name in COMMANDS]
        if present:
            lines.append(f"{title}:")
            lines += [f"  {name:<{width}}{COMMANDS[name][1]}" for name in present]
            lines.append("")
    lines.append("`partialfc COMMAND --help` lists a command's options and their defaults.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="partialfc",
        usage="partialfc [-h] [--version] COMMAND ...",
        description=DESCRIPTION,
        epilog=command_groups(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version())
    return parser


def command_parser(name: str, module=None) -> argparse.ArgumentParser:
    """The parser of one command (its module is imported unless given)."""
    module = module or importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(
        prog=f"partialfc {name}",
        description=COMMANDS[name][1],
        formatter_class=DefaultsHelpFormatter,
    )
    module.add_arguments(parser, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--version":
        print(version())
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name = argv[0]
    if name in RENAMED:
        print(f"note: {RENAMED[name]}", file=sys.stderr)
    module = importlib.import_module(COMMANDS[name][0])
    parser = command_parser(name, module)
    args = parser.parse_args(argv[1:])
    args.command = name
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
