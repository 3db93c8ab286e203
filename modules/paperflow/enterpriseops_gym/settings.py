"""enterpriseops_gym's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices

# what the claims and the report read: S3 compares noop, random, heuristic and golden, the report the HTTP/MCP path
# (mock_llm); S3/S4 these modes
CLAIM_AGENTS = ("noop", "random", "heuristic", "golden", "mock_llm")
CLAIM_MODES = ("oracle", "plus_10")


def check(cfg: dict[str, Any], source: str) -> None:
    require_choices(
        cfg["agents"], source=source, key="agents", required=CLAIM_AGENTS, why="the claims S3/S4 and the report compare"
    )
    require_choices(cfg["modes"], source=source, key="modes", required=CLAIM_MODES, why="the claims S3/S4 compare")
    if cfg["tasks"]["n_infeasible"] < 3:
        raise ConfigError(
            f"{source}: tasks.n_infeasible ({cfg['tasks']['n_infeasible']}) must be >= 3, one per infeasible kind "
            "(permission, nonexistent, policy)"
        )
    if cfg["source"]["kind"] == "official":
        check_official(cfg, source)


def check_official(cfg: dict[str, Any], source: str) -> None:
    """Paper scale: the official data named, and GPUs exactly for the models vLLM serves."""
    missing = [k for k in ("tasks", "dbs") if k not in cfg["source"]] + (["official"] if "official" not in cfg else [])
    if missing:
        raise ConfigError(f"{source}: source.kind 'official' needs {', '.join(missing)} (see the paper block)")
    boxes = cfg["official"].get("containers") or {}
    if boxes.get("start"):
        images = boxes.get("images") or {}
        missing = sorted(set(cfg["official"]["servers"]) - set(images))
        if missing:
            raise ConfigError(
                f"{source}: official.containers.images has no image for server(s) {missing} of official.servers "
                "(containers.start is true: the train job starts every server)"
            )
    served = sorted(m for m, c in cfg["official"]["models"].items() if c["serve"] == "vllm")
    heavy = sorted(cfg["resources"].get("gpu_datasets", []))
    if heavy != served:
        raise ConfigError(
            f"{source}: resources.gpu_datasets ({heavy}) must list exactly the models served by vLLM ({served}): "
            "their train jobs get the GPUs, API models run on CPU"
        )


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names of paperflow.enterpriseops_gym.claims.metrics_table (synthetic source only; the
    official source's report judges no claims)."""
    if cfg["source"]["kind"] != "synthetic":
        return []
    per_mode = [f"{m}/{r}" for m in cfg["modes"] for r in ("success", "refused_correctly", "side_effect")]
    return per_mode + [
        "all_modes/success",
        "all_modes/same_final_db_as_golden",
        "all_modes/pass_minus_success",
        "distractor_gain/success",
        "oracle/between_random_and_golden",
        "mutation/every_mutant_caught",
        "alternative/accepted",
    ]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The agents run, the minimum over them (`every_agent`), the mutation test's two checkers and the alternative
    plans' control (`trajectory_match`)."""
    if cfg["source"]["kind"] != "synthetic":
        return []
    return [*cfg["agents"], "every_agent", "verifiers", "row_count_verifiers", "trajectory_match"]
