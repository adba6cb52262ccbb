"""The protocol interface: ``protocol.run(embed_fn) -> list of reports``."""

from __future__ import annotations

from ..embedding import EmbedFn
from ..results import Result


class Protocol:
    """An evaluation protocol. Subclasses set ``name`` and implement :meth:`run`.

    ``embed_fn`` maps uint8 images ``(N, H, W[, C])`` to ``(N, d)`` embeddings; protocols
    call it through :func:`partialfc.eval.embedding.embed_images` (batching, flip test).
    """

    name: str = "protocol"
    flip: bool = False
    batch_size: int = 256
    # protocols over user folders may leave unreadable images out (``eval --skip-bad``):
    # ``skips_bad`` says a protocol can, ``refused`` lists ``(file, reason)`` after a run
    skips_bad: bool = False
    skip_bad: bool = False
    refused: tuple = ()

    def run(self, embed_fn: EmbedFn) -> list[Result]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
