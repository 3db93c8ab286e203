"""Config rules of annealed_langevin that its JSON schema cannot express (cross-references)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_member


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
