"""lozo_plus's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.lm.models import model_config

GATED = ("lozo", "lozoplus", "lozoplus_random")  # the gated claims compare these, paired by seed
NEEDED_BY = {"lozoplus": ("lozo",), "lozoplus_random": ("lozo", "lozoplus")}


def seeds_of(method: str, cfg: dict[str, Any]) -> list[int]:
    """The seeds a method runs: `report_seeds` for the methods listed in `report_only`, `seeds` for the others."""
    return list(cfg["report_seeds"] if method in cfg["report_only"] else cfg["seeds"])


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: a model spec the kit builds, a sequence that fits, ranks that fit, the claims' methods."""
    from paperflow.lozo_plus.task import VOCAB_SIZE

    if cfg["source"]["kind"] == "superglue":
        check_paper(cfg, source)
    lm = cfg.get("pretrained_cpu")
    if lm:
        if cfg["source"]["kind"] == "superglue":
            raise ConfigError(f"{source}: pretrained_cpu is for source.kind synthetic (paper scale runs `pretrained`)")
        if max(lm["run"]["eval_subset"], lm["run"]["batch_size"]) > lm["data"]["train"]:
            raise ConfigError(f"{source}: pretrained_cpu.run.eval_subset and batch_size must not exceed data.train")
        if lm["data"]["train"] + lm["data"]["dev"] > lm["task"]["train_rows"]:
            raise ConfigError(f"{source}: pretrained_cpu.data.train + dev exceed task.train_rows")
    model_config({**cfg["model"], "vocab_size": VOCAB_SIZE})  # refuses a misspelt model key by name
    if cfg["model"].get("max_position_embeddings", 10**9) < cfg["data"]["length"] + 2:
        raise ConfigError(f"{source}: model.max_position_embeddings is shorter than BOS + data.length + SEP")
    zo = cfg["zo"]
    if zo["candidate_rank"] > zo["r_max"]:
        raise ConfigError(f"{source}: zo.candidate_rank ({zo['candidate_rank']}) exceeds zo.r_max ({zo['r_max']})")
    if cfg["run"]["eval_subset"] > cfg["data"]["train"] or cfg["run"]["batch_size"] > cfg["data"]["train"]:
        raise ConfigError(f"{source}: run.eval_subset and run.batch_size must not exceed data.train")
    gated = sorted(set(cfg["report_only"]) & set(GATED))
    if gated:
        raise ConfigError(f"{source}: report_only lists {gated}, which the gated claims compare at every seed")
    for method, needs in NEEDED_BY.items():
        missing = [n for n in needs if method in cfg["methods"] and n not in cfg["methods"]]
        if missing:
            raise ConfigError(f"{source}: method {method!r} is judged against {missing}; add it to methods")


SYNTHETIC_METRICS = ("train_loss", "dev_accuracy", "test_accuracy")
RHO_METRICS = ("rho", "rho_unweighted", "rho_over_random_value", "rho_refresh", "rho_lazy", "rho_ratio_closed_form")
RHO_METHODS = ("lozo", "lozom", "lozoplus", "lozoplus_random")
LM_PREFIX = "lm/"  # the cpu scale's real-pretrained-model metrics (paperflow.lozo_plus.pretrained_report)
LM_METRICS = ("train_loss", "test_accuracy", "accuracy_gain", "peak_rss_gib", "rho_refresh")


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.lozo_plus.claims.metrics_table at smoke, tiny and cpu
    scale; paperflow.lozo_plus.paper_report.metrics_table at paper scale)."""
    methods = cfg["methods"]
    if cfg["source"]["kind"] == "superglue":
        return ["test_score"] + (["peak_memory_ratio_to_mezo"] if {"lozoplus", "mezo"} <= set(methods) else [])
    names = [*SYNTHETIC_METRICS, "source_test_accuracy"]
    names += list(RHO_METRICS) if set(methods) & set(RHO_METHODS) else []
    if cfg.get("pretrained_cpu"):
        names += [LM_PREFIX + m for m in LM_METRICS]
    return names + (["mezo_cosine"] if "mezo" in methods else [])


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods this config runs, and `source` (the pretrained model before fine-tuning) off paper scale."""
    extra = [] if cfg["source"]["kind"] == "superglue" else ["source"]
    return list(dict.fromkeys(list(cfg["methods"]) + extra + (["pretrained"] if cfg.get("pretrained_cpu") else [])))


def check_paper(cfg: dict[str, Any], source: str) -> None:
    """Paper scale (source.kind superglue): a pretrained model and tasks given, ZO methods only, one seed per job."""
    missing = [k for k in ("pretrained", "tasks") if not cfg.get(k)]
    if missing:
        raise ConfigError(f"{source}: source.kind superglue needs {missing} (the Hub references of the paper scale)")
    from paperflow.lozo_plus.sharding import gpus_for
    from paperflow.lozo_plus.superglue import check_tasks

    check_tasks(cfg["tasks"], source)
    for method in cfg["methods"]:  # every (model, method) has a GPU count: refused by key here, not in a job
        gpus_for(cfg["resources"], cfg["pretrained"]["hub"], method)
    if cfg["seeds_per_job"] != 1:
        raise ConfigError(f"{source}: seeds_per_job must be 1 at paper scale (one run, one weights file per GPU job)")
