"""Evaluation protocols. Each is a :class:`Protocol` with ``run(embed_fn) -> list of reports``.

* :class:`VerificationBin`: InsightFace ``.bin`` sets (LFW, CFP-FP, AgeDB-30, CALFW, CPLFW)
* :class:`LfwPairs`: LFW ``pairs.txt`` over an image folder/zip (default: LFW dev pairs)
* :class:`Ijb`: IJB-B/C 1:1 and 1:N from the meta files
* :class:`OmniglotOpenSet`, :class:`OmniglotOneShot`, :class:`OmniglotHoldout`, :class:`Orl`:
  bundled/shared real data

:data:`PROTOCOLS` names them with their defaults (flip test, batch size, image size); both
``partialfc eval`` and the training config build them through :func:`build_protocols`.
"""

from .base import Protocol
from .ijb import (
    Ijb,
    ijb_one_to_many,
    ijb_one_to_one,
    read_1n_csv,
    read_face_tid_mid,
    read_landmarks,
    read_template_pairs,
)
from .omniglot import OmniglotHoldout, OmniglotOneShot, OmniglotOpenSet
from .orl import Orl
from .pairs import LfwPairs, VerificationBin
from .registry import PROTOCOLS, build_protocol, build_protocols


def published_results(report_name: str) -> dict[str, float]:
    """Published results ``{method: value}`` to quote next to a report of this name ({} if
    none): the protocol classes carry them as ``PUBLISHED``."""
    if report_name.startswith("omniglot_one_shot"):
        return dict(OmniglotOneShot.PUBLISHED)
    return {}


__all__ = [
    "PROTOCOLS",
    "build_protocol",
    "build_protocols",
    "published_results",
    "Ijb",
    "LfwPairs",
    "OmniglotHoldout",
    "OmniglotOneShot",
    "OmniglotOpenSet",
    "Orl",
    "Protocol",
    "VerificationBin",
    "ijb_one_to_many",
    "ijb_one_to_one",
    "read_1n_csv",
    "read_face_tid_mid",
    "read_landmarks",
    "read_template_pairs",
]
