"""dualreform's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.lm.models import model_config

NEEDED_BY = {  # a method and the methods whose results its claims compare it with
    "dualreform": ("sft_human",),
    "retpo": ("sft_human",),
    "single_role": ("sft_human",),
    "random_ref": ("sft_human",),
}


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: the world's sizes agree, the model spec is one the kit builds, every preference method
    has the SFT model it starts from."""
    w = cfg["world"]
    if not w["response_values"] <= w["values_per_passage"] <= w["values_per_aspect"]:
        raise ConfigError(f"{source}: world needs response_values <= values_per_passage <= values_per_aspect")
    if w["min_turns"] > w["max_turns"]:
        raise ConfigError(f"{source}: world.min_turns ({w['min_turns']}) > world.max_turns ({w['max_turns']})")
    model_config({**cfg["model"], "vocab_size": 8})  # refuses a misspelt model key by name
    for method, needs in NEEDED_BY.items():
        missing = [n for n in needs if method in cfg["methods"] and n not in cfg["methods"]]
        if missing:
            raise ConfigError(f"{source}: method {method!r} starts from {missing}; add it to methods")
