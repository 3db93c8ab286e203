"""The cross-paper summary: every claim of every paper, read from their metrics.json files, central claims first."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from paperflow.core import claims as claims_lib


def measured(claim: dict) -> str:
    """The judged value with its interval (exact for a worst-seed claim)."""
    return claims_lib.interval_text(claim)


def verdict(claim: dict) -> str:
    return claims_lib.verdict_text(claim)


def threshold(claim: dict) -> str:
    return f"{claims_lib.effect_text(claim)} {claims_lib.condition_text(claim)}"


def summary_markdown(metrics_files: Iterable[str | Path], scale: str) -> str:
    rows = [
        "| paper | claim | estimate [CI] | claimed | verdict | control | gated |",
        "|---|---|---|---|---|---|---|",
    ]
    papers = []
    for path in metrics_files:
        doc = json.loads(Path(path).read_text())
        papers.append(doc)
        for c in sorted(doc["claims"], key=lambda c: not c.get("central", False)):
            star = "★ " if c.get("central") else ""
            control = claims_lib.control_text(c)
            rows.append(
                f"| {doc['paper']} | {star}`{c['id']}`: {c['statement']} | {measured(c)} | {threshold(c)} "
                f"| {verdict(c)} | {control} | {'yes' if c['gated'] else 'no'} |"
            )
    held = sum(doc["all_gated_held"] for doc in papers)
    judged = [c for doc in papers for c in doc["claims"] if c["gated"]]
    head = [
        f"# paperflow summary — scale `{scale}`",
        "",
        f"{held} of {len(papers)} paper(s) had all their gated claims hold. Gated verdicts: "
        f"{claims_lib.counts_text(judged)}. ★ marks a paper's central claims. Each paper's report is "
        f"`results/{scale}/<slug>/report.md`; this table is generated from their `metrics.json`.",
        "",
    ]
    return "\n".join(head + rows) + "\n"
