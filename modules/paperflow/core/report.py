"""`metrics.json` and the Markdown report of a paper.

The report contract: a paper's library builds a `Report` (its long metrics table, text sections, tables and figures,
each table and figure under the report rule's output key, `table_<name>` / `figure_<name>`), and
`publish` writes every output of the rule from it: the figures and CSV tables, `report.md` with links
relative to it, `metrics.json` and `metrics.parquet`. An output the report does not fill, or a key the rule lacks,
raises, so renaming an output cannot silently break a report.

The claims are not built here: a paper declares them in `config/<slug>.yaml` and its report carries the long
metrics table they are judged on (`paperflow.core.claims`); `publish` judges them, so `held` is always computed
from the numbers, never set by hand. Every paper writes `metrics.json` with a top-level `claims` list in the same
shape, so the cross-paper summary reads them all alike.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def mean_std_text(values: Sequence[float], digits: int = 3) -> str:
    """A table cell for per-seed values: "mean ± std" (std with ddof 1) over the finite ones, the value alone when
    one is left, "n/a" when none is."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return "n/a"
    if arr.size == 1:
        return f"{arr[0]:.{digits}f}"
    return f"{arr.mean():.{digits}f} ± {arr.std(ddof=1):.{digits}f}"


def write_metrics(path: str | Path, *, paper: str, scale: str, claims: Iterable[Any], **extra: Any) -> dict[str, Any]:
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


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "_(no rows)_"
    columns = list(columns or rows[0].keys())
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        out.append(
            "| " + " | ".join(fmt(v) if isinstance(v, float) else str(v) for v in (row[c] for c in columns)) + " |"
        )
    return "\n".join(out)


def render_report(
    *,
    title: str,
    scale: str,
    summary: str,
    claims: Sequence[Any],
    sections: Sequence[tuple[str, str]] = (),
    figures: Sequence[tuple[str, str]] = (),
    limitations: Sequence[str] = (),
    tables: Sequence[tuple[str, str]] = (),
) -> str:
    """The report: verdict, claims table, free sections, figures and table files (caption, path
    relative to the report). `claims` are Claim objects or judged claims (`paperflow.core.claims.Verdict`)."""
    from paperflow.core import claims as claims_lib

    judged = [c.to_json() for c in claims]
    gated = [c for c in claims if c.gated]
    verdict = (
        f"{sum(c.held for c in gated)} of {len(gated)} gated claim(s) held at scale `{scale}`."
        if gated
        else f"No gated claims at scale `{scale}`."
    )
    verdict += f" Gated verdicts: {claims_lib.counts_text(c for c in judged if c['gated'])}."
    table = claims_lib.claims_table(judged) + (
        "\n\nIntervals: " + "; ".join(claims_lib.interval_methods(judged)) + ". A claim is **held** when its interval "
        "lies wholly on the claimed side of the threshold, **refuted** when wholly on the other side, "
        "**inconclusive** otherwise (with the units the observed spread would need); **control also holds** when "
        "the alternative in the method's place is held too. ★ marks the paper's central claims."
    )
    parts = [
        f"# {title}",
        "",
        f"Scale: `{scale}`. {verdict}",
        "",
        summary,
        "",
        "## Claims",
        "",
        table,
        "",
    ]
    for heading, body in sections:
        parts += [f"## {heading}", "", body, ""]
    if tables:
        parts += ["## Tables", ""] + [f"- [{caption}]({path})" for caption, path in tables] + [""]
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


REPORT_KEY, METRICS_KEY, METRICS_TABLE_KEY = "report", "metrics", "metrics_table"
FIGURE_PREFIX, TABLE_PREFIX = "figure_", "table_"


@dataclass(frozen=True)
class Figure:
    """A figure of the report, saved as PNG to the report rule's output `key` (`figure_<name>`)."""

    key: str
    caption: str
    figure: Any  # a matplotlib Figure; `publish` saves and closes it


@dataclass(frozen=True)
class Table:
    """A table file of the report, written as CSV to the report rule's output `key` (`table_<name>`)."""

    key: str
    caption: str
    frame: Any  # a pandas DataFrame


@dataclass
class Report:
    """Everything a paper's report shows; `publish` turns it into the report rule's outputs."""

    title: str
    summary: str
    table: Any  # the long metrics table (scale, seed, unit, method, metric, value) the config's claims are judged on
    claims: list[Any] = field(default_factory=list)  # the judged claims (paperflow.core.claims.Verdict), set by publish
    sections: list[tuple[str, str]] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    limitations: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)  # the paper's own keys of metrics.json


def _check_outputs(report: Report, outputs: Mapping[str, Any]) -> None:
    named = {**{f.key: FIGURE_PREFIX for f in report.figures}, **{t.key: TABLE_PREFIX for t in report.tables}}
    for key, prefix in named.items():
        if not key.startswith(prefix):
            raise ValueError(f"report output key {key!r} must start with {prefix!r}")
    if len(named) != len(report.figures) + len(report.tables):
        raise ValueError("two figures or tables of the report share an output key")
    expected = {REPORT_KEY, METRICS_KEY, METRICS_TABLE_KEY, *named}
    missing = sorted(expected - set(outputs))
    if missing:
        raise KeyError(
            f"the report writes {missing}, which the report rule does not declare; its outputs: {sorted(outputs)}"
        )
    unfilled = sorted(set(outputs) - expected)
    if unfilled:
        raise KeyError(f"report rule output(s) {unfilled} are not written by the report; it writes {sorted(expected)}")


def publish(
    report: Report, outputs: Mapping[str, Any], *, paper: str, scale: str, claims: Sequence[Any]
) -> dict[str, Any]:
    """Write the figures, tables, `report.md` and `metrics.json` of `report` to the rule's `outputs`
    (output key -> path); links in the report are relative to it. Returns the metrics document.

    `claims` (the paper's `claims:` from its config, as measured at this scale) are judged here on `report.table`,
    the long metrics table, which is written to the output `metrics_table` (Parquet)."""
    from paperflow.core import claims as claims_lib
    from paperflow.core import plots

    outputs = {k: str(v) for k, v in outputs.items()}
    _check_outputs(report, outputs)
    if report.claims:
        raise ValueError("a paper's report does not build claims: they are declared in its config and judged here")
    specs = claims_lib.specs_for(claims, f"config/{paper}.yaml")
    report.claims = claims_lib.judge_all(specs, report.table, scale)
    Path(outputs[METRICS_TABLE_KEY]).parent.mkdir(parents=True, exist_ok=True)
    report.table.to_parquet(outputs[METRICS_TABLE_KEY], index=False)
    here = Path(outputs[REPORT_KEY]).parent
    link = lambda key: os.path.relpath(outputs[key], here)
    for fig in report.figures:
        plots.save(fig.figure, outputs[fig.key])
    for table in report.tables:
        Path(outputs[table.key]).parent.mkdir(parents=True, exist_ok=True)
        table.frame.to_csv(outputs[table.key], index=False)
    text = render_report(
        title=report.title,
        scale=scale,
        summary=report.summary,
        claims=report.claims,
        sections=report.sections,
        figures=[(f.caption, link(f.key)) for f in report.figures],
        tables=[(t.caption, link(t.key)) for t in report.tables],
        limitations=report.limitations,
    )
    Path(outputs[REPORT_KEY]).write_text(text)
    return write_metrics(outputs[METRICS_KEY], paper=paper, scale=scale, claims=report.claims, **report.metrics)


def publish_job(job: Any, report: Report) -> dict[str, Any]:
    """`publish` into the outputs of a report rule's job (paperflow.core.job.Job), with the paper and
    scale the job runs; the provenance record notes which claims held."""
    params = dict(job.params.items())
    not_measured = list(params["claims_not_measured"])
    if not_measured:
        report.limitations.append(
            f"Claims declared in config/{job.paper}.yaml but not measured at scale `{job.scale}` (their data or "
            f"methods run at other scales only): {', '.join(f'`{c}`' for c in not_measured)}."
        )
    doc = publish(report, dict(job.output.items()), paper=job.paper, scale=job.scale, claims=params["claims"])
    job.note(claims_held={c.id: c.held for c in report.claims})
    return doc
