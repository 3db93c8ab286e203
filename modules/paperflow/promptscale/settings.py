"""promptscale's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices
from paperflow.core.lm.models import model_config

GATED_VARIANTS = ("em", "randomk")  # the primary claims and their section-11 control


def check(cfg: dict[str, Any], source: str) -> None:
    """The model spec is one the kit builds and holds the longest sequence; M >= K; both gated variants run;
    the report-only seeds are among the seeds (their EM model feeds the solver)."""
    model_config({**cfg["model"], "vocab_size": 40})  # refuses a misspelt model key by name
    em = cfg["em"]
    if em["evaluation"]["m"] < em["k"]:
        raise ConfigError(f"{source}: em.evaluation.m ({em['evaluation']['m']}) must be >= em.k ({em['k']})")
    longest = 1 + 1 + 3 + 1 + 13 + 1 + em["max_plan"] + 1  # bos <c> c.. <x> x.. <z> z.. eos (q's template)
    if cfg["model"].get("max_position_embeddings", 10**9) < longest:
        raise ConfigError(f"{source}: model.max_position_embeddings is below the longest sequence ({longest})")
    require_choices(cfg["variants"], source=source, key="variants", required=GATED_VARIANTS)
    extra = [s for s in cfg["report_seeds"] if s not in cfg["seeds"]]
    if extra:
        raise ConfigError(f"{source}: report_seeds {extra} are not in seeds {cfg['seeds']}")
