"""Writing the kept samples of a training set in the input's own format."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from partialfc.atomic import atomic_output, atomic_write_bytes


def write_cleaned_set(dataset, keep: np.ndarray, out_dir: str | Path, clean_labels=None) -> Path:
    """Write the kept samples, in the input's own format, to ``out_dir``.

    * images in memory (``ArrayDataset``-like: ``.images``): ``cleaned.npz`` with ``images``,
      ``labels``, ``indices`` (positions in the input) [, ``clean_labels``];
    * RecordIO: ``cleaned.rec`` + ``cleaned.idx`` with the kept records copied byte for byte
      (labels in their headers; no InsightFace header record);

    and, for any input, ``kept.lst`` with one ``index<TAB>label`` line per kept sample.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keep = np.asarray(keep, dtype=bool)
    labels = np.asarray(dataset.labels, dtype=np.int64)
    if keep.shape != labels.shape:
        raise ValueError(f"keep has shape {keep.shape} for a set of {labels.shape[0]} samples")
    indices = np.flatnonzero(keep)
    text = "".join(f"{i}\t{labels[i]}\n" for i in indices)
    atomic_write_bytes(out_dir / "kept.lst", text.encode())
    if hasattr(dataset, "images"):
        arrays = {
            "images": np.asarray(dataset.images)[indices],
            "labels": labels[indices],
            "indices": indices.astype(np.int64),
        }
        if clean_labels is not None:
            arrays["clean_labels"] = np.asarray(clean_labels, dtype=np.int64)[indices]
        with atomic_output(out_dir / "cleaned.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        return out_dir / "cleaned.npz"
    if hasattr(dataset, "reader") and hasattr(dataset, "keys"):
        from partialfc.data.recordio import RecordIOWriter

        with RecordIOWriter(out_dir / "cleaned.rec") as writer:
            for new_key, i in enumerate(indices, start=1):
                writer.write(new_key, bytes(dataset.reader.payload(int(dataset.keys[i]))))
        return out_dir / "cleaned.rec"
    return out_dir / "kept.lst"
