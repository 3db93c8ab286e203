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

from paperflow.core.config import ConfigError, _did_you_mean

COMPARISONS = ("<", "<=", ">", ">=", "within")
AGGREGATES = ("mean", "worst")
UNITS = ("seed", "item")
EFFECTS = ("difference", "ratio")
SCALES = ("tiny", "smoke", "cpu", "paper")
DEFAULT_GATED_SCALES = ("smoke", "cpu", "paper")
DEFAULT_LEVEL = 0.95
N_BOOT = 4000
TABLE_COLUMNS = ("scale", "seed", "unit", "method", "metric", "value")
SEED_UNIT = ""  # the `unit` of a row that holds one value for the whole seed

HELD, REFUTED, INCONCLUSIVE, CONTROL_HOLDS, NO_DATA = "held", "refuted", "inconclusive", "control also holds", "no data"
VERDICTS = (HELD, REFUTED, INCONCLUSIVE, CONTROL_HOLDS, NO_DATA)
N_NEEDED_CAP = 1_000_000


@dataclass(frozen=True)
class ClaimSpec:
    """One claim as declared in `config/<slug>.yaml`."""

    id: str
    statement: str
    metric: str
    method: str
    comparison: str
    threshold: float = 0.0
    baseline: str | float | None = None
    effect: str = "difference"
    unit: str = "seed"
    aggregate: str = "mean"
    gated: bool = True
    scales: tuple[str, ...] = DEFAULT_GATED_SCALES
    central: bool = False
    control: Mapping[str, Any] | None = None
    paper_value: str | None = None
    limitation: str | None = None
    level: float = DEFAULT_LEVEL

    def gated_at(self, scale: str) -> bool:
        return self.gated and scale in self.scales

    @property
    def baseline_method(self) -> str | None:
        return self.baseline if isinstance(self.baseline, str) else None

    @property
    def control_method(self) -> str | None:
        return None if self.control is None else str(self.control["method"])

    def methods(self) -> list[str]:
        return [m for m in (self.method, self.baseline_method, self.control_method) if m is not None]


SPEC_KEYS = tuple(ClaimSpec.__dataclass_fields__)
REQUIRED_SPEC_KEYS = ("id", "statement", "metric", "method", "comparison")


def parse_claims(raw: Any, source: str) -> list[ClaimSpec]:
    """The claims of a paper's `claims:` list (already schema-checked), with cross-key checks the schema cannot
    express: unique ids, a ratio needs a baseline, a control names a method other than the claim's."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: claims must be a list of claims")
    specs, seen = [], set()
    for i, item in enumerate(raw):
        where = f"{source}: claims[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where} must be a mapping with keys {', '.join(REQUIRED_SPEC_KEYS)}")
        unknown = [k for k in item if k not in SPEC_KEYS]
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], SPEC_KEYS)}; allowed keys: {', '.join(SPEC_KEYS)}"
            )
        missing = [k for k in REQUIRED_SPEC_KEYS if k not in item]
        if missing:
            raise ConfigError(f"{where} lacks {', '.join(missing)}")
        for key, allowed in (
            ("comparison", COMPARISONS),
            ("aggregate", AGGREGATES),
            ("unit", UNITS),
            ("effect", EFFECTS),
        ):
            if key in item and item[key] not in allowed:
                raise ConfigError(
                    f"{where}.{key} = {item[key]!r} is not allowed; allowed values: {', '.join(map(repr, allowed))}"
                )
        kw = dict(item)
        kw["scales"] = tuple(kw.get("scales", DEFAULT_GATED_SCALES))
        for scale in kw["scales"]:
            if scale not in SCALES:
                raise ConfigError(f"{where}.scales: {scale!r} is not a scale; allowed values: {', '.join(SCALES)}")
        kw["threshold"] = float(kw.get("threshold", 0.0))
        if isinstance(kw.get("baseline"), (int, float)) and not isinstance(kw.get("baseline"), bool):
            kw["baseline"] = float(kw["baseline"])
        spec = ClaimSpec(**kw)
        if spec.id in seen:
            raise ConfigError(f"{where}.id = {spec.id!r} repeats an earlier claim's id")
        seen.add(spec.id)
        if spec.effect == "ratio" and spec.baseline is None:
            raise ConfigError(f"{where}: effect 'ratio' needs a baseline (a method or a constant)")
        if spec.comparison == "within" and spec.threshold < 0:
            raise ConfigError(f"{where}.threshold = {spec.threshold} must be >= 0 for 'within' (the half-width)")
        if spec.control is not None:
            if not isinstance(spec.control, Mapping) or "method" not in spec.control or "why" not in spec.control:
                raise ConfigError(f"{where}.control must be a mapping with keys 'method' and 'why'")
            if spec.control["method"] in (spec.method, spec.baseline):
                raise ConfigError(
                    f"{where}.control.method = {spec.control['method']!r} must differ from the claim's method and baseline"
                )
        if not 0.5 < spec.level < 1:
            raise ConfigError(f"{where}.level = {spec.level} must lie in (0.5, 1)")
        specs.append(spec)
    return specs


def check_vocabulary(
    specs: Sequence[ClaimSpec], *, metrics: Iterable[str], methods: Iterable[str], source: str, scale: str
) -> list[ClaimSpec]:
    """The claims this run measures. ConfigError naming the key of the first claim gated at `scale` whose metric
    or method the paper's code does not produce at this config (checked when the DAG is built, from the paper's
    declared vocabulary), or of a gated claim without a control; a claim not gated at `scale` whose names this run
    does not produce is left out (reported as not measured)."""
    metrics, methods = sorted(set(metrics)), sorted(set(methods))
    kept = []
    for i, spec in enumerate(specs):
        where = f"{source}: claims[{i}] ({spec.id})"
        if spec.gated and spec.control is None:
            raise ConfigError(
                f"{where}: a gated claim needs a control (method, why): the plausible alternative that should fail it"
            )
        if not spec.gated_at(scale):
            if spec.metric not in metrics or any(m not in methods for m in (spec.method, spec.baseline_method) if m):
                continue
            if spec.control_method is not None and spec.control_method not in methods:
                spec = replace(spec, control=None)  # reported without its control where the alternative does not run
        kept.append(spec)
        if spec.metric not in metrics:
            raise ConfigError(
                f"{where}.metric = {spec.metric!r} is not a metric of this paper{_did_you_mean(spec.metric, metrics)}; "
                f"allowed values: {', '.join(metrics)}"
            )
        for key, name in (
            ("method", spec.method),
            ("baseline", spec.baseline_method),
            ("control.method", spec.control_method),
        ):
            if name is not None and name not in methods:
                raise ConfigError(
                    f"{where}.{key} = {name!r} is not a method this run produces{_did_you_mean(name, methods)}; "
                    f"allowed values: {', '.join(methods)}"
                )
    return kept


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
            f"| {interval_text(v)} | {v['n_units']} {v['unit']}s | {verdict_text(v)} | {control_text(v)} "
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
