"""doubt's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices
from paperflow.core.lm.models import model_config

NEEDED = ("doubt", "vmf_plain", "se_plain")  # the methods the gated claims compare


def check(cfg: dict[str, Any], source: str) -> None:
    """The model spec is one the kit builds; the claims' methods are there; every n fits in n_max and n_max is
    scored; the format mix is a distribution; the prompts fit the model's positions."""
    model_config({**cfg["model"], "vocab_size": 16})  # refuses a misspelt model key by name
    require_choices(cfg["methods"], source=source, key="methods", required=NEEDED)
    n_max, ns = cfg["sampling"]["n_max"], cfg["scoring"]["ns"]
    if any(n > n_max for n in ns) or n_max not in ns:
        raise ConfigError(f"{source}: scoring.ns {ns} must be <= sampling.n_max ({n_max}) and include it")
    mix = cfg["train"]["format_mix"]
    if abs(sum(mix) - 1) > 1e-6:
        raise ConfigError(f"{source}: train.format_mix {mix} must sum to 1")
    longest = 16 + 8 + 2 + cfg["sampling"]["max_list_tokens"] + cfg["sampling"]["max_new_tokens"] + 2
    if cfg["model"].get("max_position_embeddings", 10**9) < longest:
        raise ConfigError(f"{source}: model.max_position_embeddings is shorter than an OUB prompt and its answer")
