"""Config rules of mtbl_wc that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, reject_unknown, require_keys, require_member

SYNTHETIC = ("quadratic", "concave")
CLEANING = ("digits", "mnist")
NEEDS = {
    "quadratic": ("n_obj", "dim_x", "dim_y", "rows", "rank", "sv_range", "b_scale", "c_scale"),
    "concave": ("dim_x", "dim_y", "sv_range"),
    "digits": ("n_train", "n_val", "n_test", "noise", "zero_columns", "n_components", "groups"),
    "mnist": ("n_train", "n_val", "n_test", "noise", "zero_columns", "n_components", "groups"),
}


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_problems"]:
        require_member(name, cfg["problems"], source, "run_problems[...]")
    for name, spec in cfg["problems"].items():
        where = f"{source}: problems.{name}"
        require_keys(spec["instance"], NEEDS[spec["kind"]], f"{where}.instance (kind {spec['kind']})")
        reject_unknown(spec["instance"], NEEDS[spec["kind"]], f"{where}.instance (kind {spec['kind']})")
        if spec["kind"] == "mnist" and spec["url"] is None:
            raise ConfigError(f"{where} (kind mnist) needs url and sha256")
        inst = spec["instance"]
        if spec["kind"] == "quadratic" and not inst["rank"] < min(inst["rows"], inst["dim_y"]):
            raise ConfigError(
                f"{where}.instance.rank = {inst['rank']} must be < min(rows, dim_y) = "
                f"{min(inst['rows'], inst['dim_y'])}: the lower level must not be strongly convex (LLGC)"
            )
        if spec["kind"] == "concave" and not inst["dim_x"] < inst["dim_y"]:
            raise ConfigError(f"{where}.instance.dim_x = {inst['dim_x']} must be < dim_y = {inst['dim_y']} (LLGC)")
        if "uniform" in spec["methods"] and spec["kind"] in SYNTHETIC:
            raise ConfigError(
                f"{where}.methods: 'uniform' (the warm start, no steps) is a hyper-cleaning baseline only"
            )
        if spec["kind"] == "quadratic":
            if spec["rate_checkpoints"] is None:
                raise ConfigError(f"{where}: rate_checkpoints is required for kind quadratic")
            cps, solver = spec["rate_checkpoints"], spec["solver"]
            if any(c % solver["eval_every"] for c in cps) or max(cps) > solver["steps"]:
                raise ConfigError(
                    f"{where}.rate_checkpoints = {cps} must be multiples of solver.eval_every = "
                    f"{solver['eval_every']} and at most solver.steps = {solver['steps']}"
                )
        if spec["solver"]["rho_max"] < spec["solver"]["rho0"]:
            raise ConfigError(f"{where}.solver.rho_max must be >= rho0")


# The metrics of the long metrics table (paperflow.mtbl_wc.claims.metrics_table) the config's claims are judged on:
# "<problem>/<metric>/<how>", one value per (method, seed) from the per-preference metrics of evaluate.
QUADRATIC_CLAIM_METRICS = (
    "rel_dist_wc/max",  # max over preferences
    "h_norm/max",
    "angle_deg/max",
    "angle_deg/min_off_middle",  # min over r_1 != 0.5
    "K_best/rate_ratio_min",  # min over preferences and consecutive rate checkpoints of K_best(c_i) / K_best(c_i+1)
    "K_best/slope_last_decade",  # mean over preferences of the log-log slope of K_best over the last decade of steps
)
CONCAVE_CLAIM_METRICS = ("rel_dist_wc_f/max_middle", "min_f_rel/max_middle")  # max over 0.25 < r_1 < 0.75
CLEANING_AT_MIDDLE = ("max_f", "detect_f1", "test_acc")  # at r = (0.5, 0.5), where the preferences hold it
CLEANING_STEER = "f1/rmax_minus_rmin"  # f_1 at the largest r_1 minus f_1 at the smallest


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.mtbl_wc.claims.metrics_table)."""
    names = []
    for name in cfg["run_problems"]:
        spec = cfg["problems"][name]
        if spec["kind"] == "quadratic":
            names += [f"{name}/{m}" for m in QUADRATIC_CLAIM_METRICS]
        elif spec["kind"] == "concave":
            names += [f"{name}/{m}" for m in CONCAVE_CLAIM_METRICS]
        else:
            names.append(f"{name}/{CLEANING_STEER}")
            if any(abs(r - 0.5) < 1e-9 for r in spec["preferences"]):
                names += [f"{name}/{m}/r0.5" for m in CLEANING_AT_MIDDLE]
    return names


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods some run problem runs."""
    return sorted({m for name in cfg["run_problems"] for m in cfg["problems"][name]["methods"]})
