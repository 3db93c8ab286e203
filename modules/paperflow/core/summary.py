"""The cross-paper summary: every claim of every paper, read from their metrics.json files."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from paperflow.core.report import AGGREGATES, fmt


def measured(claim: dict) -> str:
    """The judged value; a worst-seed (or best-seed) claim says which aggregate it is, a claim on a pooled
    statistic names the statistic."""
    aggregate = claim.get("aggregate", "mean")
    if aggregate == "mean":
        return fmt(claim["value"])
    return (
        f"{fmt(claim['value'])} ({aggregate} over seeds)"
        if aggregate in AGGREGATES
        else f"{fmt(claim['value'])} ({aggregate})"
    )


def summary_markdown(metrics_files: Iterable[str | Path], scale: str) -> str:
    rows = ["| paper | claim | measured | threshold | held | gated |", "|---|---|---|---|---|---|"]
    papers = []
    for path in metrics_files:
        doc = json.loads(Path(path).read_text())
        papers.append(doc)
        for c in doc["claims"]:
            rows.append(
                f"| {doc['paper']} | `{c['id']}`: {c['statement']} | {measured(c)} | {c['comparison']} {fmt(c['threshold'])} "
                f"| {'**yes**' if c['held'] else '**NO**'} | {'yes' if c['gated'] else 'no'} |"
            )
    held = sum(doc["all_gated_held"] for doc in papers)
    head = [
        f"# paperflow summary — scale `{scale}`",
        "",
        f"{held} of {len(papers)} paper(s) had all their gated claims hold. Each paper's report is "
        f"`results/{scale}/<slug>/report.md`; this table is generated from their `metrics.json`.",
        "",
    ]
    return "\n".join(head + rows) + "\n"
