"""Evaluate an embedding function on a list of protocols and write the report."""

from __future__ import annotations

import time

from .embedding import EmbedFn
from .protocols.base import Protocol
from .report_writer import summary_line, write_report


def evaluate_model(
    embed_fn: EmbedFn,
    protocols: list[Protocol],
    out_dir,
    title: str = "Evaluation report",
    meta: dict | None = None,
    log=print,
) -> list:
    """Run every protocol with ``embed_fn`` (uint8 images → (N, d) embeddings), write
    ``results.json`` / ``report.md`` / plots to ``out_dir``, and return the reports."""
    if not protocols:
        raise ValueError("no evaluation protocols given")
    reports, timings = [], {}
    for protocol in protocols:
        start = time.perf_counter()
        produced = protocol.run(embed_fn)
        timings[protocol.name] = round(time.perf_counter() - start, 2)
        for r in produced:
            if log:
                log(summary_line(r))
        reports.extend(produced)
    write_report(reports, out_dir, title=title, meta={**(meta or {}), "seconds": timings})
    return reports
