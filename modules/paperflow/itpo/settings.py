"""itpo's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices
from paperflow.core.lm.models import model_config

GATED = ("outcome", "prime", "itponorm")  # the methods the gated claims compare
PRM_METHODS = ("prime", "itpo", "itponorm", "itponorm_grpo")


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: the model spec is one the kit builds and holds the longest episode; the claims' methods are
    all there; the control rides on a method that trains a PRM."""
    from paperflow.itpo.env import MAX_LENGTH

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
