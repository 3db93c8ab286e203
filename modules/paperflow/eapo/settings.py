"""eapo's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.lm.models import model_config
from paperflow.eapo.methods import METHODS

GATED = ("grpo", "eapo", "eapo_baseprior")  # the methods the gated claims compare (all `seeds`)
PAPER_ONLY = ("dapo", "luffy")  # dynamic sampling and off-policy traces: verl recipes (paper.smk), not TRL
NEEDED_BY = {"eapo": ("grpo",), "eapo_baseprior": ("grpo", "eapo")}


def seeds_of(method: str, cfg: dict[str, Any]) -> list[int]:
    """The seeds a method runs: the gated comparison's `seeds`, or `report_seeds` for the report-only methods."""
    return list(cfg["seeds"] if method in GATED else cfg["report_seeds"])


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: the model spec is one the kit builds, G_aug < G, the claims' methods are all there."""
    model_config({**cfg["model"], "vocab_size": 16})  # refuses a misspelt model key by name
    g, g_aug = cfg["rl"]["group_size"], cfg["eapo"]["g_aug"]
    if not 0 <= g_aug < g:
        raise ConfigError(f"{source}: eapo.g_aug ({g_aug}) must be below rl.group_size ({g})")
    if cfg["model"].get("max_position_embeddings", 10**9) < 3 * cfg["task"]["n_digits"] + 5:
        raise ConfigError(f"{source}: model.max_position_embeddings is shorter than a prompt and its answer")
    if cfg["source"]["kind"] == "synthetic":
        paper_only = [m for m in cfg["methods"] if m in PAPER_ONLY]
        if paper_only:
            raise ConfigError(
                f"{source}: methods {paper_only} run at paper scale only (their authors' verl recipes); allowed at "
                f"this scale: {[m for m in METHODS if m not in PAPER_ONLY]}"
            )
    for method, needs in NEEDED_BY.items():
        missing = [n for n in needs if method in cfg["methods"] and n not in cfg["methods"]]
        if missing:
            raise ConfigError(f"{source}: method {method!r} is judged against {missing}; add it to methods")


SYNTHETIC_METRICS = (
    "auc",
    "final_accuracy",
    "prior_fix_rate",
    "error_enrichment",
    "p_wrong_injected",
    "p_wrong_not_injected",
)


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics of paperflow.eapo.claims.metrics_table (the synthetic source); paper scale's math report
    judges no config claim."""
    return list(SYNTHETIC_METRICS) if cfg["source"]["kind"] == "synthetic" else []


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods this config trains (synthetic source)."""
    return list(cfg["methods"]) if cfg["source"]["kind"] == "synthetic" else []
