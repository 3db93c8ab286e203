"""uka's config rules that the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_choices

GATED = ("standard", "principles", "uka")  # the methods the gated claims compare, in both worlds
TRAINED_BY = {"uka_no_belief_test": "uka", "uka_permuted_tom": "uka"}  # a method evaluated with another method's memory
PAPER_KEYS = ("data", "pretrained", "judge", "server", "llm", "critic", "tom", "win_rate")  # source.kind esconv


def check(cfg: dict[str, Any], source: str) -> None:
    """The gated methods run in both worlds; a method that borrows a memory has its trainer; the budget can
    hold at least one turn per training user."""
    for where, methods in (("methods", cfg["methods"]), ("control.methods", cfg["control"]["methods"])):
        require_choices(methods, source=source, key=where, required=GATED)
    for method, trainer in TRAINED_BY.items():
        if method in cfg["methods"] and trainer not in cfg["methods"]:
            raise ConfigError(
                f"{source}: method {method!r} is evaluated with {trainer!r}'s memory; add {trainer!r} to methods"
            )
    if cfg["source"]["kind"] == "esconv":
        missing = [k for k in PAPER_KEYS if k not in cfg]
        if missing:
            raise ConfigError(f"{source}: source.kind esconv (paper scale) needs the keys {missing}")
        if cfg["judge"]["hub"] == cfg["pretrained"]["hub"]:
            raise ConfigError(
                f"{source}: judge.hub {cfg['judge']['hub']!r} is the backbone (pretrained.hub): the model would grade "
                "its own dialogues; pin another model"
            )
        if cfg["win_rate"]["reference"] not in cfg["methods"]:
            raise ConfigError(
                f"{source}: win_rate.reference {cfg['win_rate']['reference']!r} is not one of methods {cfg['methods']}"
            )
    if cfg["training"]["budget_turns"] < cfg["training"]["dialogues"]:
        raise ConfigError(
            f"{source}: training.budget_turns ({cfg['training']['budget_turns']}) is below training.dialogues "
            f"({cfg['training']['dialogues']}): some training users would never be met"
        )


SMOKE_COLUMNS = ("success", "turns", "entropy_t3", "need_accuracy")  # per test user (paperflow.uka.claims)
PAPER_COLUMNS = ("success", "turns", "entropy_t3")  # per ESConv test case (paperflow.uka.paper_report)


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces: "<world>/<column>" per test user in both NeedWorld worlds,
    or "esconv/<column>" per test case and "esconv/win_rate" at paper scale."""
    if cfg["source"]["kind"] == "esconv":
        return [f"esconv/{c}" for c in PAPER_COLUMNS] + ["esconv/win_rate"]
    return [f"{w}/{c}" for w in ("main", cfg["control"]["world"]) for c in SMOKE_COLUMNS]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The agents this config evaluates (in either world)."""
    methods = list(cfg["methods"])
    if cfg["source"]["kind"] != "esconv":
        methods += cfg["control"]["methods"]
    return sorted(set(methods))
