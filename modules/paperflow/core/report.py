"""Claims, `metrics.json` and the Markdown report of a paper.

A claim compares an aggregate of measured values (one per seed; the mean by default, the worst seed
for claims the spec states for every run) against a threshold; `held` is always computed here from
the numbers, never set by hand. Every paper writes `metrics.json` with a top-level
`claims` list in the same shape, so the cross-paper summary reads them all alike.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

COMPARATORS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    "<": (operator.lt, "<"),
    "<=": (operator.le, "<="),
    ">": (operator.gt, ">"),
    ">=": (operator.ge, ">="),
}

AGGREGATES: dict[str, Callable[[np.ndarray], float]] = {
    "mean": lambda arr: float(arr.mean()),
    "max": lambda arr: float(arr.max()),
    "min": lambda arr: float(arr.min()),
}


@dataclass(frozen=True)
class Claim:
    """One row of a paper's claims table."""

    id: str
    statement: str
    value: float
    threshold: float
    comparison: str
    held: bool
    gated: bool
    seeds: list[int]
    values: list[float]
    value_std: float
    aggregate: str = "mean"
    threshold_values: list[float] = field(default_factory=list)
    paper_value: str | None = None
    limitation: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or np.isnan(arr).any():
        return math.nan, math.nan
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def compare_claim(
    *,
    id: str,
    statement: str,
    values: Sequence[float],
    seeds: Sequence[int],
    comparison: str,
    threshold: float | None = None,
    threshold_values: Sequence[float] | None = None,
    gated: bool = True,
    paper_value: str | None = None,
    limitation: str | None = None,
    aggregate: str = "mean",
) -> Claim:
    """A claim that `aggregate(values) <comparison> threshold`, the threshold being a number or the mean
    of `threshold_values` (e.g. a baseline's per-seed results). `aggregate` is "mean" (over seeds),
    or "max" / "min" to judge the worst seed of a claim stated for every run. Any NaN makes the claim
    not held. `value_std` is the std over seeds whatever the aggregate."""
    if comparison not in COMPARATORS:
        raise ValueError(f"comparison {comparison!r} not in {sorted(COMPARATORS)}")
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate {aggregate!r} not in {sorted(AGGREGATES)}")
    if (threshold is None) == (threshold_values is None):
        raise ValueError("give exactly one of threshold and threshold_values")
    if len(values) != len(seeds):
        raise ValueError(f"{len(values)} values for {len(seeds)} seeds")
    arr = np.asarray(values, dtype=float)
    value = math.nan if arr.size == 0 or np.isnan(arr).any() else AGGREGATES[aggregate](arr)
    std = mean_std(values)[1]
    limit = float(threshold) if threshold is not None else mean_std(threshold_values)[0]
    fn, _ = COMPARATORS[comparison]
    held = bool(math.isfinite(value) and math.isfinite(limit) and fn(value, limit))
    return Claim(
        id=id, statement=statement, value=value, threshold=limit, comparison=comparison, held=held,
        gated=gated, seeds=list(seeds), values=[float(v) for v in values], value_std=std,
        aggregate=aggregate, threshold_values=[float(v) for v in (threshold_values or [])],
        paper_value=paper_value, limitation=limitation,
    )


def write_metrics(path: str | Path, *, paper: str, scale: str, claims: Iterable[Claim], **extra: Any) -> dict[str, Any]:
    claims = list(claims)
    doc = {
        "paper": paper,
        "scale": scale,
        "claims": [c.to_json() for c in claims],
        "all_gated_held": all(c.held for c in claims if c.gated),
        **extra,
    }
    Path(path).write_text(json.dumps(doc, indent=2, allow_nan=False, default=_finite_or_none))
    return doc


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def measured_cell(c: Claim) -> str:
    """The measured value as judged: mean ± std, or e.g. "0.03 (max over seeds)" for a worst-seed claim."""
    if c.aggregate == "mean":
        return f"{fmt(c.value)} ± {fmt(c.value_std, 2)}"
    return f"{fmt(c.value)} ({c.aggregate} over seeds)"


def claims_table(claims: Iterable[Claim]) -> str:
    rows = [
        "| claim | measured (mean ± std over seeds, unless marked) | per seed | threshold | held | gated | paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        verdict = "**yes**" if c.held else "**NO**"
        per_seed = ", ".join(f"{s}: {fmt(v)}" for s, v in zip(c.seeds, c.values))
        rows.append(
            f"| `{c.id}`: {c.statement} | {measured_cell(c)} | {per_seed} "
            f"| {c.comparison} {fmt(c.threshold)} | {verdict} | {'yes' if c.gated else 'no (reported)'} "
            f"| {c.paper_value or '–'} |"
        )
    return "\n".join(rows)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "_(no rows)_"
    columns = list(columns or rows[0].keys())
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(fmt(v) if isinstance(v, float) else str(v) for v in (row[c] for c in columns)) + " |")
    return "\n".join(out)


def render_report(
    *,
    title: str,
    scale: str,
    summary: str,
    claims: Sequence[Claim],
    sections: Sequence[tuple[str, str]] = (),
    figures: Sequence[tuple[str, str]] = (),
    limitations: Sequence[str] = (),
) -> str:
    """The report: verdict, claims table, free sections, figures (paths relative to the report)."""
    gated = [c for c in claims if c.gated]
    verdict = (
        f"{sum(c.held for c in gated)} of {len(gated)} gated claim(s) held at scale `{scale}`."
        if gated else f"No gated claims at scale `{scale}`."
    )
    parts = [f"# {title}", "", f"Scale: `{scale}`. {verdict}", "", summary, "", "## Claims", "", claims_table(claims), ""]
    for heading, body in sections:
        parts += [f"## {heading}", "", body, ""]
    if figures:
        parts += ["## Figures", ""]
        parts += [f"![{caption}]({path})\n\n_{caption}_\n" for caption, path in figures]
    if limitations:
        parts += ["## Limitations at this scale", ""] + [f"- {line}" for line in limitations] + [""]
    parts += [
        "## Provenance",
        "",
        "Every file here has a `<file>.prov.json` record (rule, inputs and outputs with sha256, params, "
        "code and environment). Verify the chain with `paperflow audit report.md`; show it with `paperflow lineage report.md`.",
        "",
    ]
    return "\n".join(parts)
