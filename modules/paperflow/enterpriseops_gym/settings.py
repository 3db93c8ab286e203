"""enterpriseops_gym's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices, require_member

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
    if cfg.get("llm_cpu"):
        check_llm(cfg, source)


def check_llm(cfg: dict[str, Any], source: str) -> None:
    """The cpu scale's language-model agent: on the generated sandbox only, on a mode whose tasks are built, with the
    plain variant (the baseline of its claims)."""
    llm = cfg["llm_cpu"]
    if cfg["source"]["kind"] != "synthetic":
        raise ConfigError(f"{source}: llm_cpu is for source.kind synthetic (paper scale serves its models by vLLM)")
    require_member(llm["mode"], cfg["modes"], source, "llm_cpu.mode")
    others = [m for m in cfg["modes"] if m != llm["mode"]]
    require_choices(llm["plain_modes"], source=source, key="llm_cpu.plain_modes", known=others, noun="mode")
    require_choices(
        llm["plans"], source=source, key="llm_cpu.plans", required=["plain"], why="the plan claims compare with it"
    )


def llm_modes(llm: dict[str, Any], plan: str) -> list[str]:
    """The tool-set modes whose tasks a plan variant runs on: `llm_cpu.mode` (where the plan claims compare the
    variants), then `llm_cpu.plain_modes` for the plain variant alone (its rates per mode, no claim)."""
    return [llm["mode"], *(llm["plain_modes"] if plan == "plain" else [])]


def llm_agents(cfg: dict[str, Any]) -> list[str]:
    """The episode table's agents of the language-model block (none when llm_cpu is null)."""
    llm = cfg.get("llm_cpu")
    return [f"llm_{p}" for p in llm["plans"]] if llm else []


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
    """The agents run (the language-model agents `llm_<plan>` where llm_cpu is set), the minimum over them
    (`every_agent`), the mutation test's two checkers and the alternative plans' control (`trajectory_match`)."""
    if cfg["source"]["kind"] != "synthetic":
        return []
    return [*cfg["agents"], *llm_agents(cfg), "every_agent", "verifiers", "row_count_verifiers", "trajectory_match"]
