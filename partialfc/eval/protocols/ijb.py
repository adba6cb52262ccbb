"""IJB-B / IJB-C 1:1 verification and 1:N identification from the benchmark's meta files.

Files read (``<root>/meta/``, ``<n>`` = ``ijbb`` or ``ijbc``), in the layout distributed with
the InsightFace IJB evaluation package:

* ``<n>_face_tid_mid.txt``: ``image_name template_id media_id`` per face image;
* ``<n>_template_pair_label.txt``: ``template_id_1 template_id_2 label`` (1 = same subject);
* ``<n>_name_5pts_score.txt``: ``image_name x1 y1 … x5 y5 detector_score`` (loose crops);
* ``<n>_1N_gallery_G1.csv``, ``<n>_1N_gallery_G2.csv``, ``<n>_1N_probe_mixed.csv``: a header
  line, then ``TEMPLATE_ID,SUBJECT_ID,…`` per row.

Templates are pooled by media (:func:`partialfc.eval.templates.pool_media_templates`) from the
raw (un-normalised) embeddings the embed function returns, optionally weighted by the
detector score (as the InsightFace reference script does). 1:N is
run for each gallery set: probes of enrolled subjects are mated (CMC, FNIR), the others are
non-mated (they set the FPIR threshold).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..embedding import EmbedFn, embed_images
from ..reports import (
    DEFAULT_FARS,
    IdentificationReport,
    VerificationReport,
    identification_report,
    verification_report,
)
from ..templates import pool_media_templates
from .base import Protocol


def _rows(path: Path, n_fields: int, skip_header: bool = False, sep: str | None = None):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: IJB meta file not found")
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if (skip_header and lineno == 1) or not line.strip():
                continue
            fields = [x.strip() for x in (line.split(sep) if sep else line.split())]
            if len(fields) < n_fields:
                raise ValueError(
                    f"{path}: line {lineno}: expected at least {n_fields} fields, got {len(fields)}"
                )
            rows.append((lineno, fields))
    if not rows:
        raise ValueError(f"{path}: no records")
    return rows


def _ints(path, rows, column: int) -> np.ndarray:
    out = np.empty(len(rows), dtype=np.int64)
    for i, (lineno, fields) in enumerate(rows):
        try:
            out[i] = int(float(fields[column]))
        except ValueError:
            raise ValueError(
                f"{path}: line {lineno}: field {column + 1} is not an integer: {fields[column]!r}"
            ) from None
    return out


def read_face_tid_mid(path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(image_names, template_ids, media_ids)`` from ``*_face_tid_mid.txt``."""
    rows = _rows(path, 3)
    return [f[0] for _, f in rows], _ints(path, rows, 1), _ints(path, rows, 2)


def read_template_pairs(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(template_1, template_2, is_same bool)`` from ``*_template_pair_label.txt``."""
    rows = _rows(path, 3)
    labels = _ints(path, rows, 2)
    if not np.isin(labels, (0, 1)).all():
        raise ValueError(f"{path}: labels must be 0 or 1")
    return _ints(path, rows, 0), _ints(path, rows, 1), labels.astype(bool)


def read_landmarks(path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(image_names, landmarks (N, 5, 2) float32, detector_scores (N,))``."""
    rows = _rows(path, 12)
    try:
        values = np.array([[float(x) for x in f[1:12]] for _, f in rows], dtype=np.float32)
    except ValueError as err:
        raise ValueError(f"{path}: non-numeric landmark field ({err})") from None
    return [f[0] for _, f in rows], values[:, :10].reshape(-1, 5, 2), values[:, 10]


def read_1n_csv(path) -> tuple[np.ndarray, np.ndarray]:
    """``(template_ids, subject_ids)`` from a 1:N gallery/probe CSV (header skipped)."""
    rows = _rows(path, 2, skip_header=True, sep=",")
    return _ints(path, rows, 0), _ints(path, rows, 1)


def _lookup(ids: np.ndarray, wanted: np.ndarray, source: str) -> np.ndarray:
    pos = np.searchsorted(ids, wanted).clip(0, ids.size - 1)
    missing = ids[pos] != wanted
    if missing.any():
        raise ValueError(
            f"{source}: {int(missing.sum())} template id(s) have no images, e.g. "
            f"{wanted[missing][:3].tolist()}"
        )
    return pos


def ijb_one_to_one(
    image_embeddings: np.ndarray,
    template_ids,
    media_ids,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    name: str = "ijb_1to1",
    fars=DEFAULT_FARS,
    chunk: int = 1_000_000,
) -> VerificationReport:
    """1:1 template verification: media-pooled templates, cosine of each template pair."""
    ids, templates = pool_media_templates(image_embeddings, template_ids, media_ids)
    t1, t2, same = pairs
    a, b = _lookup(ids, np.asarray(t1), name), _lookup(ids, np.asarray(t2), name)
    scores = np.empty(a.size, dtype=np.float64)
    for s in range(0, a.size, chunk):
        scores[s : s + chunk] = np.sum(templates[a[s : s + chunk]] * templates[b[s : s + chunk]], 1)
    return verification_report(
        name,
        scores=scores,
        is_genuine=same,
        fars=fars,
        notes=[f"{ids.size} templates (media-pooled), {a.size} template pairs"],
    )


def ijb_one_to_many(
    image_embeddings: np.ndarray,
    template_ids,
    media_ids,
    galleries: dict[str, tuple[np.ndarray, np.ndarray]],
    probes: tuple[np.ndarray, np.ndarray],
    name: str = "ijb_1toN",
    fpirs=(1e-2, 1e-1),
    max_rank: int = 20,
) -> list[IdentificationReport]:
    """1:N: one report per gallery set (``{set name: (template_ids, subject_ids)}``)."""
    ids, templates = pool_media_templates(image_embeddings, template_ids, media_ids)
    probe_t, probe_s = probes
    probe_emb = templates[_lookup(ids, np.asarray(probe_t), f"{name} probes")]
    reports = []
    for set_name, (gallery_t, gallery_s) in galleries.items():
        gallery_emb = templates[_lookup(ids, np.asarray(gallery_t), f"{name} {set_name}")]
        reports.append(
            identification_report(
                f"{name}_{set_name}",
                gallery_emb,
                gallery_s,
                probe_emb,
                probe_s,
                max_rank=max_rank,
                fpirs=fpirs,
                notes=[
                    f"gallery {set_name}: {len(gallery_t)} templates; "
                    f"{len(probe_t)} probe templates (mixed media)"
                ],
            )
        )
    return reports


class Ijb(Protocol):
    """IJB-B or IJB-C from ``root`` (``meta/`` and ``loose_crop/``), aligned to ``size``.

    Runs 1:1, and 1:N when the gallery/probe CSVs are present.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        name: str = "IJBC",
        size: int = 112,
        flip: bool = True,
        batch_size: int = 256,
        fars=DEFAULT_FARS,
        weight_by_detector_score: bool = False,
    ):
        self.root, self.name = Path(root), name
        self.weight_by_detector_score = weight_by_detector_score
        self.size, self.flip, self.batch_size, self.fars = size, flip, batch_size, fars
        self.prefix = name.lower()

    def _meta(self, suffix: str) -> Path:
        return self.root / "meta" / f"{self.prefix}_{suffix}"

    def embed_faces(self, embed_fn: EmbedFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw embeddings of every aligned face in ``face_tid_mid`` order (times the detector
        score when ``weight_by_detector_score``), with template and media ids."""
        from partialfc.data.align import align_face
        from partialfc.data.decode import decode_image

        names, tids, mids = read_face_tid_mid(self._meta("face_tid_mid.txt"))
        lm_names, landmarks, detector_scores = read_landmarks(self._meta("name_5pts_score.txt"))
        if lm_names != names:
            raise ValueError(
                f"{self._meta('name_5pts_score.txt')}: image order differs from "
                f"{self._meta('face_tid_mid.txt')}"
            )
        out = []
        for s in range(0, len(names), self.batch_size):
            faces = []
            for image_name, points in zip(
                names[s : s + self.batch_size], landmarks[s : s + self.batch_size], strict=True
            ):
                path = self.root / "loose_crop" / image_name
                image = decode_image(path.read_bytes(), str(path))
                faces.append(align_face(image, points, size=self.size))
            out.append(
                embed_images(embed_fn, np.stack(faces), self.flip, self.batch_size, normalize=False)
            )
        emb = np.concatenate(out)
        if self.weight_by_detector_score:
            emb = emb * detector_scores[:, None]
        return emb, tids, mids

    def run(self, embed_fn: EmbedFn) -> list:
        emb, tids, mids = self.embed_faces(embed_fn)
        reports = [
            ijb_one_to_one(
                emb,
                tids,
                mids,
                read_template_pairs(self._meta("template_pair_label.txt")),
                name=f"{self.prefix}_1to1",
                fars=self.fars,
            )
        ]
        probe_csv = self._meta("1N_probe_mixed.csv")
        if probe_csv.is_file():
            galleries = {
                g: read_1n_csv(self._meta(f"1N_gallery_{g}.csv"))
                for g in ("G1", "G2")
                if self._meta(f"1N_gallery_{g}.csv").is_file()
            }
            reports += ijb_one_to_many(
                emb, tids, mids, galleries, read_1n_csv(probe_csv), name=f"{self.prefix}_1toN"
            )
        return reports
