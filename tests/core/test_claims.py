"""The claims engine: intervals against scipy, every verdict kind on constructed data, config checks."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from paperflow.core import claims as C
from paperflow.core.config import ConfigError


def table(rows: dict[str, list[float]], metric: str = "err", items: int | None = None) -> pd.DataFrame:
    """A long table: per method, one value per seed (or `items` values per seed, the list giving each seed's mean)."""
    out = []
    rng = np.random.default_rng(0)
    for method, values in rows.items():
        for seed, v in enumerate(values):
            if items is None:
                out.append({"seed": seed, "method": method, "metric": metric, "value": v})
            else:
                noise = rng.normal(0, 1, items)
                noise -= noise.mean()
                out += [
                    {"seed": seed, "unit": f"u{i}", "method": method, "metric": metric, "value": v + noise[i]}
                    for i in range(items)
                ]
    return C.long_table(out, "smoke")


def spec(**kw) -> C.ClaimSpec:
    base = {"id": "c", "statement": "s", "metric": "err", "method": "new", "baseline": "old", "comparison": "<"}
    base.update(kw)
    return C.parse_claims([base], "test")[0]


# ------------------------------------------------------------------ intervals against scipy


def test_t_interval_is_scipys():
    x = [0.3, -0.1, 0.25, 0.4, 0.05, 0.2]
    mean, low, high = C.t_interval(x, 0.95)
    ref = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert mean == pytest.approx(np.mean(x)) and (low, high) == pytest.approx(ref, rel=1e-12)
    assert C.t_interval(x, 0.9)[2] < high  # a lower level gives a narrower interval


def test_one_seed_bootstrap_is_scipys_percentile_bootstrap():
    x = np.random.default_rng(1).exponential(1.0, 400)
    mean, low, high = C.two_level_bootstrap([x], 0.95, n_boot=20000, seed=3)
    ref = stats.bootstrap((x,), np.mean, confidence_level=0.95, method="percentile", n_resamples=20000, random_state=4)
    assert mean == pytest.approx(x.mean())
    se = x.std(ddof=1) / math.sqrt(x.size)
    assert low == pytest.approx(ref.confidence_interval.low, abs=0.05 * se)
    assert high == pytest.approx(ref.confidence_interval.high, abs=0.05 * se)


def test_two_level_bootstrap_counts_the_spread_between_seeds():
    rng = np.random.default_rng(2)
    groups = [rng.normal(shift, 1.0, 200) for shift in (-1.0, 0.0, 1.0, 2.0)]
    _, low2, high2 = C.two_level_bootstrap(groups, seed=0)
    _, low1, high1 = C.two_level_bootstrap([np.concatenate(groups)], seed=0)
    assert high2 - low2 > 2 * (high1 - low1)  # items alone would hide that seeds disagree


# ------------------------------------------------------------------ verdicts


def test_held_when_the_interval_clears_the_threshold():
    t = table({"new": [0.1, 0.12, 0.09, 0.11, 0.1], "old": [0.3, 0.31, 0.29, 0.33, 0.3]})
    v = C.judge(spec(), t, "smoke")
    assert v.verdict == C.HELD and v.held and v.ci_high < 0 and v.n_needed is None
    assert v.effects == pytest.approx([-0.2, -0.19, -0.2, -0.22, -0.2]) and v.ci_method.startswith("t interval")


def test_refuted_when_the_interval_lies_on_the_other_side():
    t = table({"new": [0.4, 0.42, 0.41], "old": [0.3, 0.31, 0.29]})
    v = C.judge(spec(), t, "smoke")
    assert v.verdict == C.REFUTED and not v.held and v.ci_low > 0


def test_inconclusive_reports_the_seeds_the_spread_needs():
    new, old = [0.10, 0.25, 0.05, 0.2], [0.2, 0.2, 0.2, 0.2]
    v = C.judge(spec(), table({"new": new, "old": old}), "smoke")
    assert v.verdict == C.INCONCLUSIVE and not v.held
    n = v.n_needed
    d = np.subtract(new, old)
    half = lambda k: stats.t.ppf(0.975, k - 1) * d.std(ddof=1) / math.sqrt(k)  # noqa: E731
    assert half(n) < abs(d.mean()) <= half(n - 1)  # the fewest seeds at which the interval would clear 0


def test_control_also_holding_voids_the_claim():
    t = table({"new": [0.1, 0.11, 0.1], "alt": [0.1, 0.12, 0.11], "old": [0.3, 0.31, 0.3]})
    v = C.judge(spec(control={"method": "alt", "why": "the mechanism off"}), t, "smoke")
    assert v.verdict == C.CONTROL_HOLDS and not v.held
    assert v.control["verdict"] == C.HELD and v.control["method"] == "alt"
    t2 = table({"new": [0.1, 0.11, 0.1], "alt": [0.3, 0.32, 0.29], "old": [0.3, 0.31, 0.3]})
    v2 = C.judge(spec(control={"method": "alt", "why": "the mechanism off"}), t2, "smoke")
    assert v2.verdict == C.HELD and v2.control["verdict"] != C.HELD


def test_a_missing_seed_or_nan_is_no_data():
    t = table({"new": [0.1, 0.1, 0.1], "old": [0.3, 0.3, 0.3]})
    v = C.judge(spec(), t[~((t.method == "new") & (t.seed == 1))], "smoke")
    assert v.verdict == C.NO_DATA and not v.held
    t.loc[0, "value"] = np.nan
    assert C.judge(spec(), t, "smoke").verdict == C.NO_DATA
    # against a constant too: a seed the method lacks (that another method has) is no data, not a smaller sample
    t = table({"new": [0.02, 0.03, 0.025], "old": [1.0, 1.0, 1.0]})
    assert C.judge(spec(baseline=None, threshold=0.05), t, "smoke").verdict == C.HELD
    v = C.judge(spec(baseline=None, threshold=0.05), t[~((t.method == "new") & (t.seed == 2))], "smoke")
    assert v.verdict == C.NO_DATA and v.seeds == [0, 1, 2]


def test_worst_seed_is_exact():
    t = table({"new": [0.1, 0.1, 0.35], "old": [0.3, 0.3, 0.3]})
    v = C.judge(spec(aggregate="worst"), t, "smoke")
    assert v.verdict == C.REFUTED and v.value == pytest.approx(0.05) and v.ci_method.startswith("exact")
    assert C.judge(spec(aggregate="worst", comparison="<", threshold=0.1), t, "smoke").verdict == C.HELD
    # a worst-seed claim over items counts seeds, and its table row says so
    items = table({"new": [0.1, 0.1, 0.35], "old": [0.3, 0.3, 0.3]}, items=5)
    w = C.judge(spec(aggregate="worst", unit="item"), items, "smoke")
    assert w.n_units == 3 and "| 3 seeds |" in C.claims_table([w.to_json()])


def test_constant_baseline_ratio_and_within():
    t = table({"new": [0.02, 0.03, 0.025, 0.02], "old": [1.0, 1.1, 0.9, 1.0]})
    assert C.judge(spec(baseline=None, threshold=0.05), t, "smoke").verdict == C.HELD
    ratio = C.judge(spec(effect="ratio", comparison="<=", threshold=0.1), t, "smoke")
    assert ratio.verdict == C.HELD and ratio.effects[1] == pytest.approx(0.03 / 1.1)
    same = table({"new": [1.0, 1.01, 0.99, 1.0], "old": [1.0, 1.0, 1.0, 1.0]})
    assert C.judge(spec(comparison="within", threshold=0.05), same, "smoke").verdict == C.HELD
    far = table({"new": [2.0, 2.01, 1.99, 2.0], "old": [1.0, 1.0, 1.0, 1.0]})
    assert C.judge(spec(comparison="within", threshold=0.05), far, "smoke").verdict == C.REFUTED


def test_item_claims_pool_items_with_the_two_level_bootstrap():
    t = table({"new": [0.0, 0.1, 0.05], "old": [0.5, 0.55, 0.6]}, items=300)
    v = C.judge(spec(unit="item"), t, "smoke")
    assert v.unit == "item" and v.n_units == 900 and v.verdict == C.HELD and "bootstrap" in v.ci_method
    small = table({"new": [0.0, 0.1, 0.05], "old": [0.1, 0.05, 0.08]}, items=20)
    w = C.judge(spec(unit="item"), small, "smoke")
    assert w.verdict == C.INCONCLUSIVE and w.n_needed > w.n_units


def test_gating_follows_the_scales():
    s = spec(scales=["cpu"], control={"method": "alt", "why": "w"})
    assert s.gated_at("cpu") and not s.gated_at("smoke")


# ------------------------------------------------------------------ config checks


def test_bad_claims_are_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"claims\[0\]\.comparison = '=<' is not allowed"):
        spec(comparison="=<")
    with pytest.raises(ConfigError, match=r"unknown key 'threshhold' \(did you mean 'threshold'\?\)"):
        C.parse_claims(
            [{"id": "c", "statement": "s", "metric": "m", "method": "a", "comparison": "<", "threshhold": 1}], "t"
        )
    with pytest.raises(ConfigError, match="needs a baseline"):
        spec(baseline=None, effect="ratio")
    gated = [spec()]
    with pytest.raises(ConfigError, match="a gated claim needs a control"):
        C.check_vocabulary(gated, metrics=["err"], methods=["new", "old"], source="t", scale="smoke")
    ok = [spec(control={"method": "alt", "why": "w"})]
    with pytest.raises(ConfigError, match=r"claims\[0\] \(c\)\.metric = 'err' is not a metric.*allowed values: acc"):
        C.check_vocabulary(ok, metrics=["acc"], methods=["new", "old", "alt"], source="t", scale="smoke")
    with pytest.raises(ConfigError, match=r"control\.method = 'alt' is not a method"):
        C.check_vocabulary(ok, metrics=["err"], methods=["new", "old"], source="t", scale="smoke")
    # not gated at tiny: a control that tiny does not run is dropped, a missing baseline leaves the claim out
    assert C.check_vocabulary(ok, metrics=["err"], methods=["new", "old"], source="t", scale="tiny")[0].control is None
    assert C.check_vocabulary(ok, metrics=["err"], methods=["new"], source="t", scale="tiny") == []


def test_an_absent_method_in_the_table_is_an_error_naming_the_claim():
    with pytest.raises(KeyError, match="claim 'c': the metrics table has no metric 'err' for method 'new'"):
        C.judge(spec(), table({"old": [1.0, 2.0]}), "smoke")
