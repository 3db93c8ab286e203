"""Judged claims land in metrics.json, the report's claims table and the cross-paper summary in one shape."""

from __future__ import annotations

import json

from paperflow.core import claims as C
from paperflow.core.report import write_metrics
from paperflow.core.summary import summary_markdown


def verdicts(new: list[float], old: list[float], **extra) -> list[C.Verdict]:
    rows = [
        {"seed": s, "method": m, "metric": "err", "value": v}
        for m, vs in (("new", new), ("old", old))
        for s, v in enumerate(vs)
    ]
    rows += [{"seed": s, "method": "alt", "metric": "err", "value": v} for s, v in enumerate(old)]
    table = C.long_table(rows, "smoke")
    specs = C.parse_claims(
        [
            {
                "id": "main",
                "statement": "new beats old",
                "metric": "err",
                "method": "new",
                "baseline": "old",
                "comparison": "<",
                "central": True,
                "control": {"method": "alt", "why": "the mechanism off"},
                **extra,
            },
            {
                "id": "side",
                "statement": "new below 1",
                "metric": "err",
                "method": "new",
                "comparison": "<",
                "threshold": 1.0,
                "gated": False,
            },
        ],
        "test",
    )
    return C.judge_all(specs, table, "smoke")


def test_metrics_json_keeps_held_and_adds_the_verdict_and_interval(tmp_path):
    path = tmp_path / "metrics.json"
    write_metrics(path, paper="p", scale="smoke", claims=verdicts([0.1, 0.12, 0.11], [0.3, 0.31, 0.3]))
    doc = json.loads(path.read_text())
    main = doc["claims"][0]
    assert main["verdict"] == "held" and main["held"] is True and doc["all_gated_held"] is True
    assert main["ci_high"] < 0 and main["ci_level"] == 0.95 and main["n_units"] == 3 and main["central"]
    assert main["control"]["method"] == "alt" and main["control"]["verdict"] == "refuted"
    write_metrics(path, paper="p", scale="smoke", claims=verdicts([0.1, 0.4, 0.11], [0.3, 0.31, 0.3]))
    doc = json.loads(path.read_text())
    assert doc["claims"][0]["verdict"] == "inconclusive" and doc["all_gated_held"] is False
    assert doc["claims"][0]["n_needed"] > 3


def test_summary_puts_central_claims_first_with_intervals_and_controls(tmp_path):
    path = tmp_path / "metrics.json"
    claims = verdicts([0.1, 0.12, 0.11], [0.3, 0.31, 0.3])
    write_metrics(path, paper="p", scale="smoke", claims=claims[::-1])  # the side claim first in the file
    text = summary_markdown([path], "smoke")
    rows = [r for r in text.splitlines() if r.startswith("| p |")]
    assert (
        rows[0].startswith("| p | ★ `main`: new beats old | -0.1933 [")
        and "(95 %) | new - old < 0 | **held** |" in rows[0]
    )
    assert "`alt` in its place: refuted" in rows[0]
    assert "`side`" in rows[1] and rows[1].endswith("| no |")
    assert "Gated verdicts: 1 held." in text


def test_report_claims_table_names_the_interval_method_and_n_needed():
    from paperflow.core.report import render_report

    text = render_report(title="T", scale="smoke", summary="S", claims=verdicts([0.1, 0.4, 0.11], [0.3, 0.31, 0.3]))
    assert "t interval over 3 seeds" in text and "**inconclusive** (needs ~" in text
    assert "0 of 1 gated claim(s) held at scale `smoke`. Gated verdicts: 1 inconclusive." in text


def test_mean_std_text_over_the_finite_values():
    from paperflow.core.report import mean_std_text

    assert mean_std_text([1.0, 2.0, 3.0]) == "2.000 ± 1.000"
    assert mean_std_text([0.5, float("nan")]) == "0.500"
    assert mean_std_text([float("nan")]) == "n/a" and mean_std_text([]) == "n/a"
    assert mean_std_text([1.0, 2.0], digits=1) == "1.5 ± 0.7"
