"""ORL / AT&T faces (40 subjects x 10 images): verification over all pairs, closed-set and
open-set identification.

* verification: all 79,800 pairs (1,800 genuine, 78,000 impostor);
* closed set: gallery = image 1 of each subject, probes = images 2-10 (360);
* open set: subjects 1-20 enrolled (image 1), their images 2-10 are mated probes (180),
  all 200 images of subjects 21-40 are non-mated probes.
"""

from __future__ import annotations

import numpy as np

from ..embedding import EmbedFn, embed_images
from ..reports import DEFAULT_FARS, identification_report, verification_report
from .base import Protocol


class Orl(Protocol):
    name = "orl"

    def __init__(self, root=None, flip: bool = False, fars=DEFAULT_FARS, batch_size: int = 256):
        self.root, self.flip, self.fars, self.batch_size = root, flip, fars, batch_size

    def run(self, embed_fn: EmbedFn) -> list:
        from partialfc.data.loaders import load_orl

        data = load_orl(self.root)
        emb = embed_images(embed_fn, data.images, self.flip, self.batch_size)
        labels = data.labels
        iu = np.triu_indices(len(emb), 1)
        scores = np.sum(emb[iu[0]] * emb[iu[1]], axis=1)
        same = labels[iu[0]] == labels[iu[1]]
        first = np.r_[True, labels[1:] != labels[:-1]]  # first image of each subject
        enrolled = labels < 20
        return [
            verification_report("orl_all_pairs", scores=scores, is_genuine=same, fars=self.fars),
            identification_report(
                "orl_closed_set",
                emb[first],
                labels[first],
                emb[~first],
                labels[~first],
                notes=["gallery: image 1 of each subject; probes: images 2-10"],
            ),
            identification_report(
                "orl_open_set",
                emb[first & enrolled],
                labels[first & enrolled],
                emb[~(first & enrolled)],
                labels[~(first & enrolled)],
                fpirs=(1e-2, 1e-1),
                notes=["subjects 1-20 enrolled; subjects 21-40 are non-mated probes"],
            ),
        ]
