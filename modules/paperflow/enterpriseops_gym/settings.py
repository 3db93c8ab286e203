"""enterpriseops_gym's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices

# what the gated claims read: S1-S6 compare these agents, S3/S4 these modes
CLAIM_AGENTS = ("noop", "random", "heuristic", "golden", "mock_llm")
CLAIM_MODES = ("oracle", "plus_10")


def check(cfg: dict[str, Any], source: str) -> None:
    require_choices(
        cfg["agents"], source=source, key="agents", required=CLAIM_AGENTS, why="the gated claims S1-S6 compare"
    )
    require_choices(cfg["modes"], source=source, key="modes", required=CLAIM_MODES, why="the claims S3/S4 compare")
    if cfg["tasks"]["n_infeasible"] < 3:
        raise ConfigError(
            f"{source}: tasks.n_infeasible ({cfg['tasks']['n_infeasible']}) must be >= 3, one per infeasible kind "
            "(permission, nonexistent, policy)"
        )
