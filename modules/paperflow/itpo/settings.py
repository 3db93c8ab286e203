"""itpo's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices
from paperflow.core.lm.models import model_config
from paperflow.itpo.budget import MAX_LENGTH

GATED = ("outcome", "prime", "itponorm")  # the methods the gated claims compare
PRM_METHODS = ("prime", "itpo", "itponorm", "itponorm_grpo")
CONTROL_PRM = "itponorm_permuted_prm"  # ITPO-norm's permuted-outcome PRM (section 11), a method of the table
# paper scale: ITPO-norm's turn lengths n_k in its PRM turn score's place (the turn AUROC's control)
TURN_LENGTH_CONTROL = "itponorm_turn_length"


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: the model spec is one the kit builds and holds the longest episode; the claims' methods are
    all there; the control rides on a method that trains a PRM."""
    if cfg["source"]["kind"] == "collabllm":
        check_paper(cfg, source)
        return
    model_config(cfg["model"])  # refuses a misspelt model key by name
    if cfg["model"].get("max_position_embeddings", 10**9) < MAX_LENGTH:
        raise ConfigError(f"{source}: model.max_position_embeddings must be >= {MAX_LENGTH} (the longest episode)")
    require_choices(cfg["methods"], source=source, key="methods", required=GATED)
    bad = [m for m in cfg["rl"]["control_methods"] if m not in PRM_METHODS or m not in cfg["methods"]]
    if bad:
        raise ConfigError(
            f"{source}: rl.control_methods {bad} must be methods that train a PRM and are in methods "
            f"(allowed: {[m for m in PRM_METHODS if m in cfg['methods']]})"
        )
    if "itponorm" not in cfg["rl"]["control_methods"]:
        raise ConfigError(f"{source}: rl.control_methods must hold itponorm (the gated control of section 11)")


def check_paper(cfg: dict[str, Any], source: str) -> None:
    """Paper scale: the methods are the recipe's, each task has a beta for each, one seed per job, and the job's
    GPUs are the simulator's plus verl's."""
    from paperflow.itpo.recipe import METHODS

    require_choices(cfg["methods"], source=source, key="methods", known=tuple(METHODS), noun="paper-scale method")
    for name, task in cfg["tasks"].items():
        missing = [m for m in cfg["methods"] if m not in task["beta"]]
        if missing:
            raise ConfigError(f"{source}: tasks.{name}.beta has no value for {missing} (reward_model.model.beta_train)")
    if cfg["seeds_per_job"] != 1:
        raise ConfigError(f"{source}: seeds_per_job must be 1 at paper scale (one verl run per job)")
    gpus = int(cfg["simulator"]["tensor_parallel"]) + int(cfg["verl"]["n_gpus"])
    if cfg["resources"]["gpus"] != gpus:
        raise ConfigError(
            f"{source}: resources.gpus = {cfg['resources']['gpus']} but the train and evaluate jobs use "
            f"simulator.tensor_parallel + verl.n_gpus = {gpus}"
        )


SYNTHETIC_METRICS = ("success_auc", "adv_volatility", "turn_auroc", "auroc_ci_miss", "adv_volatility_excess")


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metric names of the report's metrics table: the synthetic analysis, or per task the evaluation reward at
    paper scale (paperflow.itpo.claims / paper_report.metrics_table)."""
    if cfg["source"]["kind"] == "collabllm":
        return [f"{task}/{m}" for task in cfg["tasks"] for m in ("reward", "turn_auroc")]
    return list(SYNTHETIC_METRICS)


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The trained methods, and at synthetic scales ITPO-norm's permuted-outcome PRM (section 11's control), at
    paper scale ITPO-norm's turn lengths in its turn score's place (the turn AUROC's control)."""
    if cfg["source"]["kind"] == "collabllm":
        return [*cfg["methods"], TURN_LENGTH_CONTROL]
    return [*cfg["methods"], CONTROL_PRM]
