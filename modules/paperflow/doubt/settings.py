"""doubt's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices
from paperflow.core.lm.models import model_config

NEEDED = ("doubt", "vmf_plain", "se_plain", "se_exact")  # the methods the gated claims and their controls compare
PAPER_KEYS = ("vlms", "benchmarks", "judge", "encoder")


def check(cfg: dict[str, Any], source: str) -> None:
    """The model spec is one the kit builds; the claims' methods are there; every n fits in n_max and n_max is
    scored; the format mix is a distribution; the prompts fit the model's positions. At paper scale: the MLLMs,
    benchmarks, judge and encoder are given, every benchmark has a reader, the entailment methods have their NLI
    model, a sharded MLLM its GPUs' memory, and VL-Uncertainty its perturbations (only there: not at smoke scale)."""
    n_max, ns = cfg["sampling"]["n_max"], cfg["scoring"]["ns"]
    if any(n > n_max for n in ns) or n_max not in ns:
        raise ConfigError(f"{source}: scoring.ns {ns} must be <= sampling.n_max ({n_max}) and include it")
    if cfg["source"]["kind"] == "benchmarks":
        check_paper(cfg, source)
        return
    if "vl_uncertainty" in cfg["methods"]:
        raise ConfigError(
            f"{source}: methods: vl_uncertainty runs at paper scale only (source.kind benchmarks: blurred images and "
            "LLM-rephrased questions); the grid scenes have neither"
        )
    model_config({**cfg["model"], "vocab_size": 16})  # refuses a misspelt model key by name
    require_choices(cfg["methods"], source=source, key="methods", required=NEEDED)
    mix = cfg["train"]["format_mix"]
    if abs(sum(mix) - 1) > 1e-6:
        raise ConfigError(f"{source}: train.format_mix {mix} must sum to 1")
    longest = 16 + 8 + 2 + cfg["sampling"]["max_list_tokens"] + cfg["sampling"]["max_new_tokens"] + 2
    if cfg["model"].get("max_position_embeddings", 10**9) < longest:
        raise ConfigError(f"{source}: model.max_position_embeddings is shorter than an OUB prompt and its answer")


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces: paperflow.doubt.claims.metrics_table at smoke, tiny and cpu
    scale (per n of scoring.ns, and at n_max), paperflow.doubt.paper_report.metrics_table at paper scale."""
    n_max = cfg["sampling"]["n_max"]
    if cfg["source"]["kind"] == "benchmarks":
        return ["auroc_official/full_set"]
    per_n = [f"{m}/n{n}" for n in cfg["scoring"]["ns"] for m in ("auroc", "auroc_std_subsamples", "detection_accuracy")]
    return per_n + [f"{m}/n{n_max}" for m in ("auroc_item", "flag_rate", "flag_rate_consistent_wrong")]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The detectors this config scores."""
    return list(cfg["methods"])


def check_paper(cfg: dict[str, Any], source: str) -> None:
    from paperflow.doubt.benchmarks import check_benchmarks

    missing = [k for k in PAPER_KEYS if k not in cfg]
    if missing:
        raise ConfigError(f"{source}: source.kind benchmarks needs the keys {missing} (paper block)")
    if "top_p" not in cfg["sampling"]:
        raise ConfigError(f"{source}: sampling.top_p is missing (the code samples with top_p 0.99)")
    from paperflow.doubt.paper import needs_entailment

    entailing = [m for m in cfg["methods"] if needs_entailment(m)]
    if entailing and "nli" not in cfg:
        raise ConfigError(f"{source}: methods {entailing} cluster by entailment (an NLI model): the key nli is missing")
    for name, vlm in cfg["vlms"].items():
        if vlm.get("backend") == "internvl_chat" and "max_tiles" not in vlm:
            raise ConfigError(
                f"{source}: vlms.{name}.backend internvl_chat needs max_tiles (the code's load_image max_num)"
            )
        gpus = vlm.get("gpus", 1)
        if gpus > 1 and (vlm["device"] != "cuda" or "max_memory_per_gpu" not in vlm):
            raise ConfigError(
                f"{source}: vlms.{name}.gpus = {gpus} shards the model over GPUs: it needs device 'cuda' and "
                "max_memory_per_gpu (e.g. 70GiB)"
            )
    require_choices(cfg["methods"], source=source, key="methods", required=("doubt",))
    check_benchmarks(cfg["benchmarks"], source)
    if "vl_uncertainty" in cfg["methods"]:
        check_vl_uncertainty(cfg, source)


def check_vl_uncertainty(cfg: dict[str, Any], source: str) -> None:
    """VL-Uncertainty's block: radii and a temperature for every benchmark, as many rephrasings as radii (one
    perturbed prompt per pair), and the NLI judge where a free-form benchmark clusters by entailment."""
    from paperflow.doubt.benchmarks import FREE_FORM, KIND_OF

    vlu = cfg.get("vl_uncertainty")
    if vlu is None:
        raise ConfigError(f"{source}: methods has vl_uncertainty but the key vl_uncertainty is missing")
    for key in ("blur_radii", "temperature"):
        missing = [b for b in cfg["benchmarks"] if b not in vlu[key]]
        if missing:
            raise ConfigError(f"{source}: vl_uncertainty.{key} has no entry for the benchmarks {missing}")
    k = len(vlu["rephrase_temperatures"])
    for b in cfg["benchmarks"]:
        if len(vlu["blur_radii"][b]) != k:
            raise ConfigError(
                f"{source}: vl_uncertainty.blur_radii.{b} has {len(vlu['blur_radii'][b])} radii but "
                f"rephrase_temperatures has {k}: they are paired one to one"
            )
    unknown = sorted({v for t in vlu["temperature"].values() for v in t if v != "default"} - set(cfg["vlms"]))
    if unknown:
        raise ConfigError(f"{source}: vl_uncertainty.temperature names MLLMs {unknown} that are not in vlms")
    free = [b for b in cfg["benchmarks"] if KIND_OF.get(b) == FREE_FORM]
    if free and "nli" not in cfg:
        raise ConfigError(
            f"{source}: vl_uncertainty on the free-form benchmarks {free} clusters by entailment: the key nli is "
            "missing"
        )
