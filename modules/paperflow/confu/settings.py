"""ConFu's methods and the config rules the JSON schema cannot state (called by paperflow.core.config)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from paperflow.core.config import ConfigError, require_choices


@dataclass(frozen=True)
class Method:
    """A draft to train: its head `kind`, where it starts (`scratch` or the `eagle3` head), its steps and lr, and
    ConFu's anchors per sequence and replication window l (1 for the other kinds)."""

    kind: str
    start: str
    steps: int
    lr: float
    anchors: int = 0
    window: int = 1
    n_expert: int | None = None  # None: the config's; 1: the static-embedding ablation


def _methods(cfg: Mapping[str, Any]) -> dict[str, Method]:
    d, c = cfg["draft"], cfg["confu"]
    base, extra = int(d["steps"]), int(d["extra_steps"])
    lr, lr_extra = float(d["lr"]), float(d["extra_lr"])
    confu = {"anchors": int(c["anchors"]), "window": int(c["window"])}
    return {
        "vanilla": Method("vanilla", "scratch", base, lr),
        "eagle3": Method("eagle3", "scratch", base, lr),
        # the paper's control: EAGLE-3 trained for the same extra steps as ConFu, from the same checkpoint
        "eagle3_extra": Method("eagle3", "eagle3", extra, lr_extra),
        "confu": Method("confu", "eagle3", extra, lr_extra, **confu),
        "confu_nomoe": Method("confu", "eagle3", extra, lr_extra, **confu, n_expert=1),
        "confu_norep": Method("confu", "eagle3", extra, lr_extra, anchors=confu["anchors"], window=1),
    }


METHODS = ("vanilla", "eagle3", "eagle3_extra", "confu", "confu_nomoe", "confu_norep")
GATED = ("vanilla", "eagle3", "eagle3_extra", "confu")  # claims (a)-(c) and their controls compare these
BASE = ("vanilla", "eagle3")  # trained from scratch; the others continue from eagle3


def method_of(name: str, cfg: Mapping[str, Any]) -> Method:
    table = _methods(cfg)
    if name not in table:
        raise ConfigError(f"unknown ConFu method {name!r}; choose from {', '.join(table)}")
    return table[name]


def check(cfg: dict[str, Any], source: str) -> None:
    """Cross-key rules: known methods with the gated ones present; feature layers inside the target; the tree's
    budget reachable; the evaluation temperatures include greedy (claim (a))."""
    require_choices(cfg["methods"], source=source, key="methods", known=METHODS, required=GATED, noun="method")
    layers = cfg["target"]["model"]["num_hidden_layers"]
    bad = [i for i in cfg["draft"]["feature_layers"] if not 1 <= i < layers]
    if bad:
        raise ConfigError(
            f"{source}: draft.feature_layers {bad} must lie in 1..{layers - 1} (the target's decoder layers below "
            "its last, whose raw output transformers does not return)"
        )
    dec = cfg["decoding"]
    most = dec["top_k"] + (dec["depth"] - 1) * dec["top_k"] ** 2
    if dec["nodes"] > most:
        raise ConfigError(
            f"{source}: decoding.nodes {dec['nodes']} > {most}, the candidates top_k {dec['top_k']} and depth "
            f"{dec['depth']} produce"
        )
    if 0 not in dec["temperatures"]:
        raise ConfigError(f"{source}: decoding.temperatures {dec['temperatures']} must include 0 (claim (a))")
    if cfg["confu"]["k_expert"] > cfg["confu"]["n_expert"]:
        raise ConfigError(f"{source}: confu.k_expert {cfg['confu']['k_expert']} > n_expert {cfg['confu']['n_expert']}")
    if cfg["source"]["kind"] == "specbench":
        check_paper(cfg, source)
    lm = cfg["pretrained_cpu"] if "pretrained_cpu" in cfg else None
    if lm:
        if cfg["source"]["kind"] != "synthetic":
            raise ConfigError(f"{source}: pretrained_cpu is for source.kind synthetic (paper scale runs `targets`)")
        require_choices(
            lm["methods"],
            source=source,
            key="pretrained_cpu.methods",
            known=METHODS,
            required=("eagle3",),
            noun="method",
        )
        if lm["regenerate"]["max_length"] <= lm["prompts"]["max_prompt_tokens"]:
            raise ConfigError(
                f"{source}: pretrained_cpu.regenerate.max_length {lm['regenerate']['max_length']} must exceed "
                f"pretrained_cpu.prompts.max_prompt_tokens {lm['prompts']['max_prompt_tokens']}"
            )


PAPER_KEYS = ("targets", "datasets", "benchmark", "prompts", "regenerate")


def check_paper(cfg: dict[str, Any], source: str) -> None:
    """Paper scale (source.kind specbench): the targets, prompt sets, benchmark and regeneration keys present; the
    drafts' sequences long enough for the prompts they start with."""
    missing = [k for k in PAPER_KEYS if k not in cfg]
    if missing:
        raise ConfigError(f"{source}: source.kind specbench needs the keys {missing} (see the paper block)")
    if cfg["regenerate"]["max_length"] <= cfg["prompts"]["max_prompt_tokens"]:
        raise ConfigError(
            f"{source}: regenerate.max_length {cfg['regenerate']['max_length']} must exceed "
            f"prompts.max_prompt_tokens {cfg['prompts']['max_prompt_tokens']} (the drafts learn from the responses)"
        )


# evaluation variants per method: {variant: (decoding controls, temperatures or None for all)}. The controls are the
# negative controls of the gated claims: (a) a verifier whose regular tokens see the soft prompts and contemplate
# tokens (it must lose losslessness), (b) EAGLE-3 reading features shuffled across prompts, (c) ConFu with f
# shuffled across prompts (section 11).
# vanilla and EAGLE-3 from scratch enter only claim (b), at T = 0; the T > 0 comparison is ConFu against its control.
VARIANTS: dict[str, dict[str, tuple[dict[str, Any], tuple[float, ...] | None]]] = {
    "vanilla": {"vanilla": ({}, (0.0,))},
    "eagle3": {"eagle3": ({}, (0.0,)), "eagle3_features_shuffled": ({"features": "shuffle"}, (0.0,))},
    "confu": {
        "confu": ({}, None),
        "confu_f_shuffled": ({"f": "shuffle"}, (0.0,)),
        "confu_leak": ({"leak": True}, (0.0,)),
    },
}


def controls_of(method: str) -> dict[str, tuple[dict[str, Any], tuple[float, ...] | None]]:
    return VARIANTS.get(method, {method: ({}, None)})


def _temp_key(temperature: float) -> str:
    return f"T{float(temperature):g}"  # as paperflow.confu.claims.temp_key


def claim_metrics(cfg: Mapping[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.confu.claims.metrics_table at the synthetic scales,
    paperflow.confu.paper.metrics_table at paper scale, per target)."""
    if cfg["source"]["kind"] == "specbench":
        return [f"{t}/T0/{m}" for t in cfg["targets"] for m in ("tau_prompt", "lossless", "speedup")]
    names = ["T0/lossless"]
    for temp in cfg["decoding"]["temperatures"]:
        names += [f"{_temp_key(temp)}/{m}" for m in ("tau", "tau_prompt", "acc_depth_last")]
    lm = (
        cfg["pretrained_cpu"] if "pretrained_cpu" in cfg else None
    )  # the cpu scale's real target: paperflow.confu.paper.metrics_table's names
    if lm:
        names += [f"{t}/T0/{m}" for t in lm["targets"] for m in ("tau_prompt", "lossless", "speedup")]
    return names


def claim_methods(cfg: Mapping[str, Any]) -> list[str]:
    """The evaluation variants (the methods and, at the synthetic scales, their controls) and "every_method" (the
    worst lossless share of the methods)."""
    if cfg["source"]["kind"] == "specbench":
        return [*cfg["methods"], "every_method"]
    lm = list(cfg["pretrained_cpu"]["methods"]) if "pretrained_cpu" in cfg and cfg["pretrained_cpu"] else []
    return list(dict.fromkeys([v for m in cfg["methods"] for v in controls_of(m)] + lm + ["every_method"]))
