"""``partialfc gallery enroll | remove | query``: the persistent gallery under names that say
what they do.

    partialfc gallery enroll MODEL GALLERY.npz INPUT          # one identity per label
    partialfc gallery remove MODEL GALLERY.npz NAME [NAME ...]
    partialfc gallery query MODEL GALLERY.npz IMAGES [--top-k 5] [--threshold t.json]

A thin layer over ``partialfc search`` (:mod:`partialfc.deploy.command`): each action takes the
same options as that command, minus the ones that belong to the other actions, and runs the same
code. ``partialfc search MODEL GALLERY --enroll/--remove/--query`` is the older spelling.
"""

from __future__ import annotations

import argparse
import sys

from partialfc.deploy import command as search_command

ACTIONS = {
    "enroll": "add identities: a folder root/<identity>/<image> or a .rec set",
    "remove": "delete identities by name",
    "query": "search images: a file, a folder or a .rec set; one JSON line per image",
}
# the action's positional argument: (dest in ``partialfc search``, metavar, nargs, help)
POSITIONAL = {
    "enroll": ("enroll", "INPUT", None, "image folder root/<identity>/<image> or .rec set"),
    "remove": ("remove", "NAME", "+", "identity names to remove"),
    "query": ("query", "IMAGES", None, "image file, image folder or .rec set to search"),
}
# options of ``partialfc search`` that only one action uses
ONLY_FOR = {
    "enroll": "enroll",
    "remove": "remove",
    "query": "query",
    "top_k": "query",
    "threshold": "query",
    "allow_other_model": "query",
}


def add_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in ACTIONS.items():
        sub = actions.add_parser(
            action,
            help=help_text,
            description=help_text,
            formatter_class=parser.formatter_class,
        )
        search_command.add_arguments(sub, "search")
        for option in sub._actions:
            if ONLY_FOR.get(option.dest, action) != action or option.dest == action:
                option.help = argparse.SUPPRESS  # set below from the positional argument
            elif option.dest in ("model", "gallery"):
                option.metavar = option.dest.upper()
        gallery = next(option for option in sub._actions if option.dest == "gallery")
        gallery.help = "gallery .npz (enroll creates it)"
        dest, metavar, nargs, help_text = POSITIONAL[action]
        sub.add_argument("target", metavar=metavar, nargs=nargs, help=help_text)


def run(args: argparse.Namespace) -> int:
    """Map ``gallery ACTION ... TARGET`` onto ``search ... --ACTION TARGET`` and run it."""
    given = [f"--{name}" for name in ACTIONS if getattr(args, name) not in (None, [])]
    if given:
        print(
            f"partialfc gallery {args.action}: {', '.join(given)} belongs to "
            f"`partialfc gallery {given[0][2:]}`",
            file=sys.stderr,
        )
        return 2
    search_args = argparse.Namespace(**vars(args))
    search_args.enroll, search_args.remove, search_args.query = None, [], None
    dest = POSITIONAL[args.action][0]
    setattr(search_args, dest, args.target)
    search_args.command = "gallery"
    return search_command.run(search_args)
