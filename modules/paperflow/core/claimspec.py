"""The claims a paper declares in its config, parsed and checked against the names its code produces.

Kept apart from `paperflow.core.claims` (which judges them with scipy) so that loading a config, which every job
does, needs no more than the config's own dependencies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
