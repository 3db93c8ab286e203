"""Config rules of annealed_langevin that its JSON schema cannot express (cross-references)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_member

PATHS = ("ula", "diffusion", "tempering", "dilation", "daz", "dilation_exact")  # the {path} wildcard's values

# Official committed results (results/gmm_1d/T_1.0/KL_comparison.csv): 1-D GMM, T = 1, N = 5000, t_max = 150.
PAPER_FINAL_KL = {"diffusion": 0.015, "tempering": 0.271, "ula": 1.21, "daz": 0.023, "dilation": 0.765}
PAPER_T = "1"  # the horizon of those values

# per (target, horizon): the final values of every path (paperflow.annealed_langevin.evaluation.final_values) and
# kl_over_floor = kl / floor_kl; at the claim target and T = 1 also kl_vs_paper_<path> = |kl / PAPER_FINAL_KL[path] - 1|
FINAL_METRICS = ("kl", "tv", "floor_kl", "kl_over_floor")


def claim_metric(target: str, T: str, metric: str) -> str:
    """The metrics-table name of a final metric of one target and horizon, e.g. "gmm1d/T1/kl"."""
    return f"{target}/T{T}/{metric}"


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.annealed_langevin.claims.metrics_table)."""
    names = []
    for target in cfg["run_targets"]:
        for T in map(horizon_label, cfg["targets"][target]["horizons"]):
            names += [claim_metric(target, T, m) for m in FINAL_METRICS]
            if target == cfg["claim"]["target"] and T == PAPER_T:
                names += [claim_metric(target, T, f"kl_vs_paper_{path}") for path in PAPER_FINAL_KL]
    return names


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The paths this config runs on some target."""
    return sorted({p for target in cfg["run_targets"] for p in cfg["targets"][target]["paths"]})


def horizon_label(T: float) -> str:
    """The {T} wildcard of a horizon: 1.0 -> '1', 0.1 -> '0.1'."""
    return f"{float(T):g}"


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_targets"]:
        require_member(name, cfg["targets"], source, "run_targets[...]")
    claim = cfg["claim"]
    require_member(claim["target"], cfg["run_targets"], source, "claim.target")
    target = cfg["targets"][claim["target"]]
    require_member(horizon_label(claim["T"]), [horizon_label(T) for T in target["horizons"]], source, "claim.T")
    for path in ("ula", "diffusion", "tempering"):
        require_member(path, target["paths"], source, f"targets.{claim['target']}.paths (the claim needs it)")
    for name, spec in cfg["targets"].items():
        explicit = spec["means"] is not None and spec["stds"] is not None
        if explicit == (spec["random"] is not None):
            raise ConfigError(
                f"{source}: targets.{name} needs either means + stds or a random block, not both or neither"
            )
        k = len(spec["weights"])
        if explicit:
            if len(spec["means"]) != k or len(spec["stds"]) != k:
                raise ConfigError(
                    f"{source}: targets.{name}: {len(spec['means'])} means, {len(spec['stds'])} stds, {k} weights"
                )
            dims = {len(row) for row in spec["means"] + spec["stds"]}
            if len(dims) != 1:
                raise ConfigError(
                    f"{source}: targets.{name}: means and stds rows have different lengths {sorted(dims)}"
                )
            dim = dims.pop()
        else:
            dim = spec["random"]["dim"]
        if abs(sum(spec["weights"]) - 1.0) > 1e-9:
            raise ConfigError(f"{source}: targets.{name}.weights sum to {sum(spec['weights'])}, not 1")
        need = {"density_1d": 1, "density_2d": 2}.get(spec["metric"])
        if need is not None and dim != need:
            raise ConfigError(
                f"{source}: targets.{name}.metric = {spec['metric']} needs dimension {need}, the target has {dim}"
            )
        if spec["metric"] == "density_2d" and len(spec["bins"]) != 2:
            raise ConfigError(f"{source}: targets.{name}.bins must give two counts for density_2d")
        if (spec["metric"] == "marginals") != (spec["marginals"] is not None):
            raise ConfigError(
                f"{source}: targets.{name}.marginals must be set for the marginals metric and null otherwise"
            )
        if spec["metric"] == "marginals" and spec["marginals"] > dim:
            raise ConfigError(f"{source}: targets.{name}.marginals = {spec['marginals']} exceeds the dimension {dim}")
    if cfg["imaging"]["enabled"] and not cfg["imaging"]["horizons"]:
        raise ConfigError(f"{source}: imaging.enabled needs at least one imaging.horizons entry")
