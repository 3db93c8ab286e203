"""doubt's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices
from paperflow.core.lm.models import model_config

NEEDED = ("doubt", "vmf_plain", "se_plain")  # the methods the gated claims compare
PAPER_KEYS = ("vlms", "benchmarks", "judge", "encoder")


def check(cfg: dict[str, Any], source: str) -> None:
    """The model spec is one the kit builds; the claims' methods are there; every n fits in n_max and n_max is
    scored; the format mix is a distribution; the prompts fit the model's positions. At paper scale: the MLLMs,
    benchmarks, judge and encoder are given, every benchmark has a reader, the entailment methods have their NLI
    model, and a sharded MLLM its GPUs' memory."""
    n_max, ns = cfg["sampling"]["n_max"], cfg["scoring"]["ns"]
    if any(n > n_max for n in ns) or n_max not in ns:
        raise ConfigError(f"{source}: scoring.ns {ns} must be <= sampling.n_max ({n_max}) and include it")
    if cfg["source"]["kind"] == "benchmarks":
        check_paper(cfg, source)
        return
    model_config({**cfg["model"], "vocab_size": 16})  # refuses a misspelt model key by name
    require_choices(cfg["methods"], source=source, key="methods", required=NEEDED)
    mix = cfg["train"]["format_mix"]
    if abs(sum(mix) - 1) > 1e-6:
        raise ConfigError(f"{source}: train.format_mix {mix} must sum to 1")
    longest = 16 + 8 + 2 + cfg["sampling"]["max_list_tokens"] + cfg["sampling"]["max_new_tokens"] + 2
    if cfg["model"].get("max_position_embeddings", 10**9) < longest:
        raise ConfigError(f"{source}: model.max_position_embeddings is shorter than an OUB prompt and its answer")


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
