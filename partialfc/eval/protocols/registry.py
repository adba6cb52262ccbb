"""The evaluation protocols by name, with their defaults: the one table from which both
``partialfc eval`` (its flags) and the training config (``eval.protocols``) build protocols.

A protocol is written ``NAME`` or ``NAME:ARGUMENT``:

=====================  ===================  =====  =====  =====  ===============================
name                   argument             flip   batch  size   what
=====================  ===================  =====  =====  =====  ===============================
``omniglot_open_set``  —                    no     256    28     all pairs of the 13,180
                                                                 Omniglot evaluation images
``omniglot_one_shot``  —                    no     256    28     Lake's 20 runs of 20-way
                                                                 one-shot classification
``omniglot_holdout``   ``[N_OR_NAMES]``     no     256    28     20-way one-shot episodes and
                                                                 all pairs on background
                                                                 alphabets held out of training
                                                                 (a training config fills in
                                                                 its own held-out alphabets)
``orl``                ``[ROOT]``           yes    256    —      ORL faces (default root: the
                                                                 shared data folder)
``lfw_dev``            —                    yes    256    —      LFW development pairs (shared
                                                                 data folder)
``lfw_pairs``          ``PAIRS_TXT,IMAGES`` yes    256    —      an LFW-style ``pairs.txt`` over
                                                                 an image folder or zip
``bin``                ``PATH``             yes    256    —      an InsightFace ``.bin`` pair file
``ijbb``, ``ijbc``     ``ROOT``             yes    256    112    IJB-B / IJB-C 1:1 and 1:N
=====================  ===================  =====  =====  =====  ===============================

*flip* is the flip test (``normalise(f(x) + f(mirror(x)))``, Deng et al., ArcFace, CVPR 2019,
§4.1): on for faces, off for handwritten characters, whose mirror image is another drawing.
*batch* is the number of images per call of the embed function; *size* the side in pixels at
which Omniglot is read and IJB faces are aligned. ``flip``, ``batch_size`` and ``size`` passed
to :func:`build_protocols` override the table; None keeps it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import Protocol

DEFAULT_BATCH_SIZE = 256  # images per call of the embed function, for every protocol
OMNIGLOT_SIZE = 28  # the side of the bundled Omniglot copy


@dataclass(frozen=True)
class ProtocolKind:
    """One row of :data:`PROTOCOLS`. ``argument`` names what follows ``NAME:`` ("" = nothing;
    in brackets = optional); ``make(argument, flip, batch_size, size)`` builds the protocol."""

    name: str
    argument: str
    flip: bool
    size: int | None
    make: Callable[[str | None, bool, int, int | None], Protocol]
    description: str
    batch_size: int = DEFAULT_BATCH_SIZE


def _omniglot_open_set(argument, flip, batch_size, size):
    from .omniglot import OmniglotOpenSet

    return OmniglotOpenSet(size=size, flip=flip, batch_size=batch_size)


def _omniglot_one_shot(argument, flip, batch_size, size):
    from .omniglot import OmniglotOneShot

    return OmniglotOneShot(size=size, flip=flip, batch_size=batch_size)


def _omniglot_holdout(argument, flip, batch_size, size):
    from partialfc.data.omniglot_holdout import holdout_alphabets_from_text

    from .omniglot import OmniglotHoldout

    if not argument:
        raise ValueError(
            "omniglot_holdout needs the held-out alphabets: omniglot_holdout:N or "
            "omniglot_holdout:NAME,NAME,... (a training config: data.holdout_background_alphabets)"
        )
    alphabets = holdout_alphabets_from_text(argument, f"omniglot_holdout:{argument}")
    return OmniglotHoldout(alphabets, size=size, flip=flip, batch_size=batch_size)


def _orl(argument, flip, batch_size, size):
    from .orl import Orl

    return Orl(argument or None, flip=flip, batch_size=batch_size)


def _lfw_dev(argument, flip, batch_size, size):
    from .pairs import LfwPairs

    return LfwPairs(flip=flip, batch_size=batch_size)


def _lfw_pairs(argument, flip, batch_size, size):
    from .pairs import LfwPairs

    pairs, _, images = argument.partition(",")
    if not pairs or not images:
        raise ValueError(f"lfw_pairs:{argument}: expected lfw_pairs:PAIRS_TXT,IMAGES")
    return LfwPairs(pairs, images, flip=flip, batch_size=batch_size)


def _bin(argument, flip, batch_size, size):
    from .pairs import VerificationBin

    return VerificationBin(argument, flip=flip, batch_size=batch_size)


def _ijb(name):
    def make(argument, flip, batch_size, size):
        from .ijb import Ijb

        return Ijb(argument, name=name, size=size, flip=flip, batch_size=batch_size)

    return make


PROTOCOLS: dict[str, ProtocolKind] = {
    kind.name: kind
    for kind in (
        ProtocolKind(
            "omniglot_open_set", "", False, OMNIGLOT_SIZE, _omniglot_open_set, "Omniglot, all pairs"
        ),
        ProtocolKind(
            "omniglot_one_shot", "", False, OMNIGLOT_SIZE, _omniglot_one_shot, "Lake's one-shot"
        ),
        ProtocolKind(
            "omniglot_holdout",
            "[N_OR_NAMES]",
            False,
            OMNIGLOT_SIZE,
            _omniglot_holdout,
            "held-out alphabets",
        ),
        ProtocolKind("orl", "[ROOT]", True, None, _orl, "ORL faces"),
        ProtocolKind("lfw_dev", "", True, None, _lfw_dev, "LFW development pairs"),
        ProtocolKind("lfw_pairs", "PAIRS_TXT,IMAGES", True, None, _lfw_pairs, "LFW pairs.txt"),
        ProtocolKind("bin", "PATH", True, None, _bin, "InsightFace .bin verification set"),
        ProtocolKind("ijbb", "ROOT", True, 112, _ijb("IJBB"), "IJB-B 1:1 and 1:N"),
        ProtocolKind("ijbc", "ROOT", True, 112, _ijb("IJBC"), "IJB-C 1:1 and 1:N"),
    )
}


def protocol_usage() -> str:
    """``omniglot_open_set, ..., bin:PATH, ...``: every name as it is written."""
    names = []
    for kind in PROTOCOLS.values():
        names.append(f"{kind.name}:{kind.argument}" if kind.argument else kind.name)
    return ", ".join(names)


def parse_protocol(spec: str, where: str = "protocol") -> tuple[ProtocolKind, str | None]:
    """``"bin:lfw.bin"`` -> (the ``bin`` row, ``"lfw.bin"``); ValueError naming ``where``."""
    name, colon, argument = str(spec).partition(":")
    kind = PROTOCOLS.get(name)
    if kind is None:
        raise ValueError(f"{where}: unknown protocol {spec!r}; choose from {protocol_usage()}")
    optional = kind.argument.startswith("[")
    if colon and not kind.argument:
        raise ValueError(f"{where}: protocol {name!r} takes no argument, got {spec!r}")
    if not argument and kind.argument and not optional:
        raise ValueError(f"{where}: protocol {spec!r} needs an argument: {name}:{kind.argument}")
    return kind, (argument or None)


def build_protocol(
    spec: str,
    flip: bool | None = None,
    batch_size: int | None = None,
    size: int | None = None,
    where: str = "protocol",
) -> Protocol:
    """The protocol ``spec`` names, with the table's defaults where an option is None."""
    kind, argument = parse_protocol(spec, where)
    return kind.make(
        argument,
        kind.flip if flip is None else bool(flip),
        kind.batch_size if batch_size is None else int(batch_size),
        None if kind.size is None else (kind.size if size is None else int(size)),
    )


def build_protocols(
    specs: list[str],
    flip: bool | None = None,
    batch_size: int | None = None,
    size: int | None = None,
    where: str = "protocol",
) -> list[Protocol]:
    """:func:`build_protocol` for each spec (all checked before any is built)."""
    for spec in specs:
        parse_protocol(spec, where)
    return [build_protocol(s, flip, batch_size, size, where) for s in specs]
