"""Claims as data, judged with confidence intervals.

A paper declares its claims in `config/<slug>.yaml` under `claims:` (schema: `config/schemas/claims.schema.yaml`);
its code computes one long metrics table (`scale, seed, unit, method, metric, value`) and never builds a claim.
This module judges every claim on that table, the same way for every paper.

The effect of a claim is `method - baseline` per pairing unit (or `method / baseline` with `effect: ratio`),
the baseline being another method of the table (paired on the same seeds and items), a constant, or absent (0).
The claim says `effect <comparison> threshold`, or with `within` that the effect lies in `[-threshold, threshold]`.

How the interval is built follows the claim's `unit`:

- `seed`: one effect per seed (items of a seed, if any, are averaged first); a Student t interval over the
  seeds (`scipy.stats.t`), level `level` (95 % by default).
- `item`: the effects of every (seed, item) pair are pooled; a two-level percentile bootstrap resamples the
  seeds, then the items within each drawn seed, and takes the pooled mean of each replicate. With one seed
  it is the ordinary percentile bootstrap of the mean (`scipy.stats.bootstrap(method="percentile")`).

Verdicts: **held** when the interval lies wholly on the claimed side of the threshold (inside the band for
`within`), **refuted** when it lies wholly on the other side (outside the band), **inconclusive** otherwise.
`aggregate: worst` claims ("in every run") and exact properties are judged on the worst seed, exactly, with
no interval. An inconclusive claim reports `n_needed`: the number of units (seeds, or items) at which the
observed spread would give an interval clearing the threshold, were the mean to stay where it is.

A claim names a negative `control`: the same claim with a plausible alternative method in the method's place
(the paper's ablation, a weaker baseline, the mechanism switched off). The control is judged beside the claim;
when the control is held as well, the claim's verdict is "control also holds" and it does not count as held.

A missing value (NaN) of a compared method makes the verdict "no data" (not held): a broken run is never a
refutation nor an inconclusive result. A method or metric absent from the table is an error naming the claim.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from paperflow.core.claimspec import (  # noqa: F401  (re-exported: the claims' vocabulary)
    AGGREGATES,
    COMPARISONS,
    CONTROL_HOLDS,
    DEFAULT_GATED_SCALES,
    DEFAULT_LEVEL,
    EFFECTS,
    HELD,
    INCONCLUSIVE,
    N_BOOT,
    N_NEEDED_CAP,
    NO_DATA,
    REFUTED,
    REQUIRED_SPEC_KEYS,
    SCALES,
    SEED_UNIT,
    SPEC_KEYS,
    TABLE_COLUMNS,
    UNITS,
    VERDICTS,
    ClaimSpec,
    check_vocabulary,
    parse_claims,
)

# ---------------------------------------------------------------------------------------------------------------
# The long metrics table


def long_table(rows: Iterable[Mapping[str, Any]], scale: str):
    """A metrics table (pandas) in the long format from rows with keys seed, method, metric, value and optionally
    unit (an item id; SEED_UNIT for a seed-level value)."""
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    if frame.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in TABLE_COLUMNS})
    if "unit" not in frame:
        frame["unit"] = SEED_UNIT
    frame["unit"] = frame["unit"].fillna(SEED_UNIT).astype(str)
    frame["scale"] = scale
    frame["seed"] = frame["seed"].astype(int)
    frame["value"] = frame["value"].astype(float)
    missing = [c for c in TABLE_COLUMNS if c not in frame]
    if missing:
        raise ValueError(f"metrics table rows lack {missing}")
    return frame[list(TABLE_COLUMNS)]


def check_table(frame) -> None:
    """ValueError when the table is not in the long format or repeats a (seed, unit, method, metric) key."""
    missing = [c for c in TABLE_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"metrics table lacks column(s) {missing}; it needs {list(TABLE_COLUMNS)}")
    dup = frame.duplicated(["seed", "unit", "method", "metric"])
    if dup.any():
        first = frame[dup].iloc[0]
        raise ValueError(
            f"metrics table repeats seed {first.seed}, unit {first.unit!r}, method {first.method!r}, metric {first.metric!r}"
        )


# ---------------------------------------------------------------------------------------------------------------
# Intervals


def t_interval(values: Sequence[float], level: float = DEFAULT_LEVEL) -> tuple[float, float, float]:
    """Mean and the two-sided Student t interval of the mean; (mean, mean, mean) when all values are equal,
    (mean, -inf, inf) with one value."""
    from scipy import stats

    arr = np.asarray(values, dtype=float)
    mean = float(arr.mean())
    if arr.size < 2:
        return mean, -math.inf, math.inf
    sd = float(arr.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, arr.size - 1)) * sd / math.sqrt(arr.size)
    return mean, mean - half, mean + half


def two_level_bootstrap(
    groups: Sequence[Sequence[float]], level: float = DEFAULT_LEVEL, n_boot: int = N_BOOT, seed: int = 0
) -> tuple[float, float, float]:
    """Pooled mean of the values of every group and its percentile interval from a two-level bootstrap: each
    replicate draws the groups (seeds) with replacement, then the items of each drawn group with replacement,
    and takes the mean of all drawn items. With one group it is the one-level percentile bootstrap of the mean."""
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if not arrays or any(a.size == 0 for a in arrays):
        raise ValueError("every group needs at least one value")
    rng = np.random.default_rng(seed)
    n_groups = len(arrays)
    picks = rng.integers(0, n_groups, size=(n_boot, n_groups)) if n_groups > 1 else np.zeros((n_boot, 1), dtype=int)
    sums = np.zeros(n_boot)
    counts = np.zeros(n_boot)
    for g, arr in enumerate(arrays):
        rows, _ = np.nonzero(picks == g)  # one replicate row per draw of this group
        if rows.size == 0:
            continue
        idx = rng.integers(0, arr.size, size=(rows.size, arr.size))
        np.add.at(sums, rows, arr[idx].sum(axis=1))
        np.add.at(counts, rows, arr.size)
    stat = sums / counts
    alpha = 1 - level
    low, high = np.quantile(stat, [alpha / 2, 1 - alpha / 2])
    pooled = float(np.concatenate(arrays).mean())
    return pooled, float(low), float(high)


def _on_side(comparison: str, x: float, threshold: float) -> bool:
    return {"<": x < threshold, "<=": x <= threshold, ">": x > threshold, ">=": x >= threshold}[comparison]


def interval_verdict(comparison: str, threshold: float, low: float, high: float) -> str:
    """held / refuted / inconclusive for an interval [low, high] of the effect."""
    if comparison == "within":
        if -threshold <= low and high <= threshold:
            return HELD
        if high < -threshold or low > threshold:
            return REFUTED
        return INCONCLUSIVE
    if comparison in ("<", "<="):
        if _on_side(comparison, high, threshold):
            return HELD
        if not _on_side(comparison, low, threshold):
            return REFUTED
        return INCONCLUSIVE
    if _on_side(comparison, low, threshold):
        return HELD
    if not _on_side(comparison, high, threshold):
        return REFUTED
    return INCONCLUSIVE


def _gap(comparison: str, threshold: float, mean: float) -> float:
    """How far the mean lies from the threshold (from the band's edge for `within`)."""
    if comparison == "within":
        return threshold - abs(mean)
    return abs(mean - threshold)


def n_needed_t(values: Sequence[float], comparison: str, threshold: float, level: float = DEFAULT_LEVEL) -> int | None:
    """The fewest seeds at which a t interval with the observed mean and standard deviation would clear the
    threshold (or lie inside the band); None when the mean sits on the threshold (no number would do)."""
    from scipy import stats

    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return None
    mean, sd = float(arr.mean()), float(arr.std(ddof=1))
    gap = _gap(comparison, threshold, mean)
    if gap <= 0:
        return None
    if sd == 0:
        return int(arr.size)
    z = float(stats.norm.ppf(0.5 + level / 2))
    n = max(2, math.ceil((z * sd / gap) ** 2))
    while n < N_NEEDED_CAP and float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n) >= gap:
        n = max(n + 1, math.ceil(n * 1.05))
    return min(n, N_NEEDED_CAP)


def n_needed_bootstrap(
    n_units: int, mean: float, low: float, high: float, comparison: str, threshold: float, level: float
) -> int | None:
    """The items at which the bootstrap interval's half-width, shrinking as 1/sqrt(n), would clear the threshold."""
    from scipy import stats

    gap = _gap(comparison, threshold, mean)
    if gap <= 0 or not math.isfinite(low) or not math.isfinite(high):
        return None
    half = (high - low) / 2
    if half == 0:
        return n_units
    se = half / float(stats.norm.ppf(0.5 + level / 2))
    z = float(stats.norm.ppf(0.5 + level / 2))
    return min(N_NEEDED_CAP, max(n_units, math.ceil(n_units * (z * se / gap) ** 2)))


# ---------------------------------------------------------------------------------------------------------------
# Judging


@dataclass(frozen=True)
class Verdict:
    """A judged claim: what `metrics.json`, the report and the record show."""

    id: str
    statement: str
    metric: str
    method: str
    baseline: str | float | None
    comparison: str
    threshold: float
    effect: str
    unit: str
    aggregate: str
    value: float  # the effect as judged: mean (pooled for items), or the worst seed's
    ci_low: float | None
    ci_high: float | None
    ci_level: float | None
    ci_method: str
    n_units: int
    n_needed: int | None
    verdict: str
    held: bool
    gated: bool
    central: bool
    seeds: list[int]
    values: list[float]  # per seed: the method's metric (mean over the seed's items)
    baseline_values: list[float]  # per seed: the baseline's (the constant, or 0 when there is none)
    effects: list[float]  # per seed: the effect
    value_std: float
    control: dict[str, Any] | None = None
    paper_value: str | None = None
    limitation: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    return value


def _values(frame, method: str, metric: str, claim_id: str):
    """The (seed, unit) -> value series of one method and metric; KeyError naming the claim if absent."""
    part = frame[(frame.method == method) & (frame.metric == metric)]
    if part.empty:
        have = sorted(frame[frame.metric == metric].method.unique())
        raise KeyError(
            f"claim {claim_id!r}: the metrics table has no metric {metric!r} for method {method!r}"
            + (f" (methods with that metric: {have})" if have else " (no method has that metric)")
        )
    return part.set_index(["seed", "unit"]).value


def _bootstrap_seed(claim_id: str) -> int:
    return int.from_bytes(hashlib.sha256(claim_id.encode()).digest()[:4], "little")


def _paired(spec: ClaimSpec, frame, method: str):
    """(seed, unit)-indexed method values, baseline values and effects, aligned on the pairs both have."""
    import pandas as pd

    mine = _values(frame, method, spec.metric, spec.id)
    if spec.baseline_method is not None:
        base = _values(frame, spec.baseline_method, spec.metric, spec.id)
        joined = pd.concat({"m": mine, "b": base}, axis=1, join="outer")  # a pair one side lacks: NaN, no data
        if joined.empty:
            raise KeyError(
                f"claim {spec.id!r}: methods {method!r} and {spec.baseline_method!r} share no (seed, unit) of metric {spec.metric!r}"
            )
        m, b = joined.m, joined.b
    else:
        # against a constant, a seed the method lacks would silently drop out of the interval: a method run on
        # several seeds is expected on every seed any method has for this metric, and a missing one is a NaN row
        # (no data). A method run on one seed only (a deterministic baseline) is judged on that seed.
        expected = sorted(frame.loc[frame.metric == spec.metric, "seed"].unique())
        present = set(mine.index.get_level_values(0))
        lost = sorted(set(expected) - present) if len(present) > 1 else []
        if lost:
            gaps = pd.Series(math.nan, index=pd.MultiIndex.from_tuples([(s, "") for s in lost], names=mine.index.names))
            mine = pd.concat([mine, gaps]).sort_index()
        m = mine
        b = pd.Series(float(spec.baseline or 0.0), index=mine.index)
    eff = m / b if spec.effect == "ratio" else m - b
    return m, b, eff


def _worst(comparison: str, effects: np.ndarray) -> float:
    if comparison in ("<", "<="):
        return float(effects.max())
    if comparison in (">", ">="):
        return float(effects.min())
    return float(effects[np.argmax(np.abs(effects))])


def _judge(spec: ClaimSpec, frame, method: str, scale: str) -> Verdict:
    m, b, eff = _paired(spec, frame, method)
    seeds = sorted(int(s) for s in eff.index.get_level_values(0).unique())
    per_seed = lambda s: s.groupby(level=0).mean().reindex(seeds).to_numpy(dtype=float)  # noqa: E731
    values, base_values, effects = per_seed(m), per_seed(b), per_seed(eff)
    common = dict(
        id=spec.id,
        statement=spec.statement,
        metric=spec.metric,
        method=method,
        baseline=spec.baseline,
        comparison=spec.comparison,
        threshold=spec.threshold,
        effect=spec.effect,
        unit=spec.unit,
        aggregate=spec.aggregate,
        gated=spec.gated_at(scale),
        central=spec.central,
        seeds=seeds,
        values=values.tolist(),
        baseline_values=base_values.tolist(),
        effects=effects.tolist(),
        value_std=float(effects.std(ddof=1)) if effects.size > 1 else 0.0,
        paper_value=spec.paper_value,
        limitation=spec.limitation,
    )
    n_units = len(seeds) if spec.unit == "seed" else int(eff.size)
    if not np.isfinite(eff.to_numpy(dtype=float)).all():
        return Verdict(
            **common, value=math.nan, ci_low=None, ci_high=None, ci_level=None, ci_method="none (a value is missing)",
            n_units=n_units, n_needed=None, verdict=NO_DATA, held=False,
        )  # fmt: skip
    if spec.aggregate == "worst":
        worst = _worst(spec.comparison, effects)
        verdict = interval_verdict(spec.comparison, spec.threshold, worst, worst)
        return Verdict(
            **common, value=worst, ci_low=worst, ci_high=worst, ci_level=None, ci_method="exact (worst seed)",
            n_units=len(seeds), n_needed=None, verdict=verdict, held=verdict == HELD,
        )  # fmt: skip
    if spec.unit == "seed":
        mean, low, high = t_interval(effects, spec.level)
        method_name = f"t interval over {len(seeds)} seeds"
        verdict = interval_verdict(spec.comparison, spec.threshold, low, high) if len(seeds) > 1 else INCONCLUSIVE
        needed = n_needed_t(effects, spec.comparison, spec.threshold, spec.level) if verdict == INCONCLUSIVE else None
    else:
        groups = [eff.xs(s, level=0).to_numpy(dtype=float) for s in seeds]
        mean, low, high = two_level_bootstrap(groups, spec.level, seed=_bootstrap_seed(spec.id + method))
        method_name = f"two-level percentile bootstrap (seeds, then items; {N_BOOT} replicates) over {len(seeds)} seed(s), {n_units} items"
        verdict = interval_verdict(spec.comparison, spec.threshold, low, high)
        needed = (
            n_needed_bootstrap(n_units, mean, low, high, spec.comparison, spec.threshold, spec.level)
            if verdict == INCONCLUSIVE
            else None
        )
    return Verdict(
        **common, value=mean, ci_low=low, ci_high=high, ci_level=spec.level, ci_method=method_name,
        n_units=n_units, n_needed=needed, verdict=verdict, held=verdict == HELD,
    )  # fmt: skip


def judge(spec: ClaimSpec, frame, scale: str) -> Verdict:
    """The verdict of one claim on the long metrics table `frame`, its control judged beside it."""
    verdict = _judge(spec, frame, spec.method, scale)
    if spec.control is None:
        return verdict
    control = _judge(spec, frame, spec.control_method, scale)
    summary = {
        "method": control.method,
        "why": str(spec.control["why"]),
        "verdict": control.verdict,
        "value": control.value,
        "ci_low": control.ci_low,
        "ci_high": control.ci_high,
        "values": control.values,
    }
    if control.verdict == HELD and verdict.verdict == HELD:
        return replace(verdict, verdict=CONTROL_HOLDS, held=False, control=summary)
    return replace(verdict, control=summary)


def judge_all(specs: Sequence[ClaimSpec], frame, scale: str) -> list[Verdict]:
    check_table(frame)
    return [judge(spec, frame, scale) for spec in specs]


# ---------------------------------------------------------------------------------------------------------------
# Showing


def fmt(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def effect_text(v: Mapping[str, Any]) -> str:
    """What the claim compares, e.g. "ph - gauss" or "diffusion / ula" or "eapo"."""
    base = v.get("baseline")
    op = "/" if v.get("effect") == "ratio" else "-"
    if base is None:
        return f"{v['method']}"
    if isinstance(base, str):
        return f"{v['method']} {op} {base}"
    return f"{v['method']} {op} {fmt(base)}"


def condition_text(v: Mapping[str, Any]) -> str:
    if v["comparison"] == "within":
        return f"within ±{fmt(v['threshold'])}"
    return f"{v['comparison']} {fmt(v['threshold'])}"


def interval_text(v: Mapping[str, Any]) -> str:
    if v.get("aggregate") == "worst":
        return f"{fmt(v['value'])} (worst seed, exact)"
    lo, hi = v.get("ci_low"), v.get("ci_high")
    if v.get("ci_level") is None or lo is None and hi is None and v.get("value") is None:
        return "n/a"
    level = round(100 * float(v["ci_level"]))
    return f"{fmt(v['value'])} [{fmt(lo)}, {fmt(hi)}] ({level} %)"


def verdict_text(v: Mapping[str, Any]) -> str:
    text = f"**{v['verdict']}**"
    if v["verdict"] == INCONCLUSIVE and v.get("n_needed") is not None:
        text += f" (needs ~{v['n_needed']} {'seeds' if v.get('unit') == 'seed' else 'items'})"
    return text


def control_text(v: Mapping[str, Any]) -> str:
    c = v.get("control")
    if not c:
        return "–"
    return f"`{c['method']}` in its place: {c['verdict']}, {fmt(c['value'])} [{fmt(c['ci_low'])}, {fmt(c['ci_high'])}]"


def verdict_counts(claims: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out = {k: 0 for k in VERDICTS}
    for c in claims:
        out[c["verdict"]] += 1
    return out


def counts_text(claims: Iterable[Mapping[str, Any]]) -> str:
    counts = verdict_counts(claims)
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "none"


def claims_table(verdicts: Iterable[Mapping[str, Any]]) -> str:
    """The Markdown claims table of a report: central claims first."""
    rows = [
        "| claim | effect | claimed | estimate [CI] | n | verdict | control | gated | paper |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    ordered = sorted(verdicts, key=lambda v: not v.get("central", False))
    for v in ordered:
        star = "★ " if v.get("central") else ""
        rows.append(
            f"| {star}`{v['id']}`: {v['statement']} | {effect_text(v)} ({v['metric']}) | {condition_text(v)} "
            f"| {interval_text(v)} | {v['n_units']} {'seed' if v.get('aggregate') == 'worst' else v['unit']}s | {verdict_text(v)} | {control_text(v)} "
            f"| {'yes' if v['gated'] else 'no (reported)'} | {v.get('paper_value') or '–'} |"
        )
    return "\n".join(rows)


def interval_methods(verdicts: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({v["ci_method"] for v in verdicts})


def specs_for(raw: Any, source: str) -> list[ClaimSpec]:
    """parse_claims for a rule's `claims` param (the list from the resolved config)."""
    return parse_claims(list(raw or []), source)


__all__ = [
    "ClaimSpec",
    "Verdict",
    "parse_claims",
    "check_vocabulary",
    "long_table",
    "judge",
    "judge_all",
    "t_interval",
    "two_level_bootstrap",
    "interval_verdict",
    "n_needed_t",
    "claims_table",
]
