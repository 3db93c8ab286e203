"""Claims are computed from the numbers, can fail, and land in metrics.json in the shared shape."""

from __future__ import annotations

import json
import math

import pytest

from paperflow.core.report import claims_table, compare_claim, write_metrics
from paperflow.core.summary import summary_markdown


def test_claim_against_baseline_mean():
    c = compare_claim(id="x", statement="s", values=[1.0, 2.0, 3.0], threshold_values=[2.5, 2.5, 2.6], seeds=[0, 1, 2], comparison="<")
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
    bad = compare_claim(id="b", statement="B", values=[float("nan")], threshold=2.0, seeds=[0], comparison="<", gated=False)
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
    claim = compare_claim(id="c", statement="C", values=[0.5, 0.25, 1.0], threshold=0.1, seeds=[3, 4, 5], comparison=">")
    row = claims_table([claim]).splitlines()[2]
    assert "| 3: 0.5, 4: 0.25, 5: 1 |" in row and "0.5833" in row
