"""Claims are computed from the numbers, can fail, and land in metrics.json in the shared shape."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from paperflow.core.report import claims_table, compare_claim, write_metrics
from paperflow.core.summary import summary_markdown


def test_claim_against_baseline_mean():
    c = compare_claim(
        id="x", statement="s", values=[1.0, 2.0, 3.0], threshold_values=[2.5, 2.5, 2.6], seeds=[0, 1, 2], comparison="<"
    )
    assert c.held and c.value == 2.0 and math.isclose(c.threshold, 2.5333333333333) and c.value_std == 1.0


@pytest.mark.parametrize("values, held", [([2.0, 2.0], False), ([1.9, 2.0], True), ([float("nan"), 0.0], False)])
def test_claim_is_strict_and_nan_never_holds(values, held):
    assert compare_claim(id="x", statement="s", values=values, threshold=2.0, seeds=[0, 1], comparison="<").held is held


def test_claim_arguments_are_checked():
    with pytest.raises(ValueError, match="exactly one"):
        compare_claim(id="x", statement="s", values=[1.0], seeds=[0], comparison="<")
    with pytest.raises(ValueError, match="comparison"):
        compare_claim(id="x", statement="s", values=[1.0], threshold=1, seeds=[0], comparison="=<")
    with pytest.raises(ValueError, match="2 values for 1 seeds"):
        compare_claim(id="x", statement="s", values=[1.0, 2.0], threshold=1, seeds=[0], comparison="<")


def test_metrics_json_shape_and_summary(tmp_path):
    ok = compare_claim(id="a", statement="A", values=[1.0], threshold=2.0, seeds=[0], comparison="<")
    bad = compare_claim(
        id="b", statement="B", values=[float("nan")], threshold=2.0, seeds=[0], comparison="<", gated=False
    )
    path = tmp_path / "metrics.json"
    write_metrics(path, paper="p", scale="tiny", claims=[ok, bad])
    doc = json.loads(path.read_text())
    for c in doc["claims"]:
        assert {"id", "statement", "value", "threshold", "held", "gated", "seeds"} <= set(c)
    assert doc["claims"][1]["value"] is None and doc["all_gated_held"] is True
    text = summary_markdown([path], "tiny")
    assert "| p | `a`: A | 1 | < 2 | **yes** | yes |" in text and "**NO**" in text
    assert "**NO**" in claims_table([bad])


def test_claims_table_shows_every_seeds_value():
    claim = compare_claim(
        id="c", statement="C", values=[0.5, 0.25, 1.0], threshold=0.1, seeds=[3, 4, 5], comparison=">"
    )
    row = claims_table([claim]).splitlines()[2]
    assert "| 3: 0.5, 4: 0.25, 5: 1 |" in row and "0.5833" in row


@pytest.mark.parametrize("aggregate, value, held", [("mean", 0.01, True), ("max", 0.025, False), ("min", 0.0, True)])
def test_claim_aggregate_judges_the_chosen_statistic(aggregate, value, held):
    # one seed of three violates `< 0.02`; only the worst-seed (max) verdict catches it
    c = compare_claim(
        id="x",
        statement="s",
        values=[0.0, 0.005, 0.025],
        threshold=0.02,
        seeds=[0, 1, 2],
        comparison="<",
        aggregate=aggregate,
    )
    assert c.aggregate == aggregate and math.isclose(c.value, value) and c.held is held
    assert math.isclose(c.value_std, 0.013228756555322952)


def test_claim_aggregate_min_against_a_baseline_and_nan():
    c = compare_claim(
        id="x",
        statement="s",
        values=[3.0, 1.0],
        threshold_values=[2.0, 2.0],
        seeds=[0, 1],
        comparison=">",
        aggregate="min",
    )
    assert c.value == 1.0 and c.threshold == 2.0 and not c.held
    assert not compare_claim(
        id="x", statement="s", values=[float("nan"), 0.0], threshold=1.0, seeds=[0, 1], comparison="<", aggregate="max"
    ).held
    with pytest.raises(ValueError, match="aggregate 'median'"):
        compare_claim(id="x", statement="s", values=[1.0], threshold=1, seeds=[0], comparison="<", aggregate="median")


def test_claim_aggregate_reaches_metrics_json_and_the_table(tmp_path):
    worst = compare_claim(
        id="w", statement="W", values=[0.5, 2.0], threshold=1.0, seeds=[0, 1], comparison="<", aggregate="max"
    )
    mean = compare_claim(id="m", statement="M", values=[0.5, 1.0], threshold=1.0, seeds=[0, 1], comparison="<")
    write_metrics(tmp_path / "metrics.json", paper="p", scale="tiny", claims=[worst, mean])
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert [c["aggregate"] for c in doc["claims"]] == ["max", "mean"] and doc["claims"][0]["value"] == 2.0
    rows = claims_table([worst, mean]).splitlines()[2:]
    assert "| 2 (max over seeds) |" in rows[0] and "**NO**" in rows[0]
    assert "| 0.75 ± 0.35 |" in rows[1] and "over seeds)" not in rows[1]


def test_summary_labels_a_worst_seed_claim(tmp_path):
    worst = compare_claim(
        id="w", statement="W", values=[0.1, 0.3], threshold=0.2, seeds=[0, 1], comparison="<", aggregate="max"
    )
    path = tmp_path / "metrics.json"
    write_metrics(path, paper="p", scale="smoke", claims=[worst])
    assert "| p | `w`: W | 0.3 (max over seeds) | < 0.2 | **NO** | yes |" in summary_markdown([path], "smoke")


def test_statistic_claim_is_judged_on_the_pooled_statistic_and_names_it():
    from paperflow.core.report import measured_cell, statistic_claim
    from paperflow.core.summary import measured

    kw = dict(id="gain", statement="s", label="95% CI low, paired bootstrap", seeds=[0, 1, 2], comparison=">")
    # per-seed values all positive, but the judged statistic is not: the claim follows the statistic
    c = statistic_claim(value=-0.01, values=[0.05, 0.02, 0.08], threshold=0.0, **kw)
    assert not c.held and c.value == -0.01 and c.value_std == pytest.approx(np.std([0.05, 0.02, 0.08], ddof=1))
    assert statistic_claim(value=0.01, values=[0.05, 0.02, 0.08], threshold=0.0, **kw).held
    assert not statistic_claim(value=float("nan"), values=[0.0] * 3, threshold=-1.0, **kw).held
    assert measured_cell(c) == "-0.01 (95% CI low, paired bootstrap)"
    assert measured(c.to_json()) == "-0.01 (95% CI low, paired bootstrap)"
    with pytest.raises(ValueError, match="aggregate over seeds"):
        statistic_claim(**{**kw, "label": "mean"}, value=0.0, values=[0.0] * 3, threshold=0.0)


def test_mean_std_text_over_the_finite_values():
    from paperflow.core.report import mean_std_text

    assert mean_std_text([1.0, 2.0, 3.0]) == "2.000 ± 1.000"
    assert mean_std_text([0.5, float("nan")]) == "0.500"
    assert mean_std_text([float("nan")]) == "n/a" and mean_std_text([]) == "n/a"
    assert mean_std_text([1.0, 2.0], digits=1) == "1.5 ± 0.7"
