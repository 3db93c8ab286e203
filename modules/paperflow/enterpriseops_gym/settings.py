"""enterpriseops_gym's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError

# what the gated claims read: S1-S6 compare these agents, S3/S4 these modes
CLAIM_AGENTS = ("noop", "random", "heuristic", "golden", "mock_llm")
CLAIM_MODES = ("oracle", "plus_10")


def check(cfg: dict[str, Any], source: str) -> None:
    missing = [a for a in CLAIM_AGENTS if a not in cfg["agents"]]
    if missing:
        raise ConfigError(f"{source}: agents lacks {missing}, which the gated claims S1-S6 compare; add them to agents")
    missing = [m for m in CLAIM_MODES if m not in cfg["modes"]]
    if missing:
        raise ConfigError(f"{source}: modes lacks {missing}, which the claims S3/S4 compare; add them to modes")
    if cfg["tasks"]["n_infeasible"] < 3:
        raise ConfigError(
            f"{source}: tasks.n_infeasible ({cfg['tasks']['n_infeasible']}) must be >= 3, one per infeasible kind "
            "(permission, nonexistent, policy)"
        )
