"""Config rules of safer that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paperflow.core.config import ConfigError, require_keys, require_member

EXPERT_METHODS = ("safer", "tpp")
CLASS_IL_METHODS = ("finetune", "ewc")
METHODS = EXPERT_METHODS + CLASS_IL_METHODS
VARIANTS = {  # the evaluation variants of each trained method (paperflow.safer.evaluation)
    "safer": ("safer",),
    "tpp": ("tpp_msp", "tpp_graph_msp", "tpp_energy"),
    "finetune": ("finetune_msp", "finetune_energy"),
    "ewc": ("ewc_energy", "ewc_msp"),
}
CLAIM_METRICS = ("aa", "af", "task_id_acc", "auroc", "fpr95", "open_acc", "open_macro_f1")  # per (variant, seed)


def expert_config(method: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """SAFER's expert settings, or TPP's: the same prompt and optimiser, no reshaping, no residual, no regulariser."""
    expert = dict(cfg["expert"])
    if method == "safer":
        return expert | dict(cfg["safer"])
    safer = cfg["safer"]
    return expert | {
        "reshape": "none",
        "beta": 0.0,
        "temperature": safer["temperature"],
        "energy_share": safer["energy_share"],
        "max_rank": safer["max_rank"],
        "energy_propagation": safer["energy_propagation"],
        "regularizer": {"compactness": 0.0, "consistency": 0.0, "energy": 0.0, "warmup": 0},
    }


def method_config(method: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly the settings `method` reads in its train and evaluate stages (a rule's params), so that
    a changed value reruns only the methods that use it: e.g. `safer.beta` reruns SAFER alone."""
    if method in EXPERT_METHODS:
        extra = {"prototype_k": cfg["tpp"]["prototype_k"]} if method == "tpp" else {}
        return {"k": cfg["backbone"]["k"], "expert": expert_config(method, cfg)} | extra
    if method in CLASS_IL_METHODS:
        drop = () if method == "ewc" else ("ewc_strength",)
        return {"k": cfg["backbone"]["k"], "class_il": {k: v for k, v in cfg["class_il"].items() if k not in drop}}
    raise ValueError(f"method {method!r} is not known; known: {', '.join(METHODS)}")


NEEDS = {
    "digits": ("knn", "noise", "noise_seed"),
    "graph2gauss_npz": ("url", "sha256", "drop_classes"),
    "ogb_zip": ("url", "sha256", "drop_classes"),
    "dgl_reddit_zip": ("url", "sha256", "drop_classes"),
}


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_datasets"]:
        require_member(name, cfg["datasets"], source, "run_datasets[...]")
    for name, spec in cfg["datasets"].items():
        require_keys(spec, NEEDS[spec["kind"]], f"{source}: datasets.{name} (kind {spec['kind']})")
    require_member(cfg["claim_dataset"], cfg["run_datasets"], source, "claim_dataset")
    if sum(cfg["protocol"]["split"]) >= 1:
        raise ConfigError(
            f"{source}: protocol.split = {cfg['protocol']['split']} leaves no test nodes; train + val must be < 1"
        )
    reg = cfg["safer"]["regularizer"]
    if reg["energy"] and reg["warmup"] >= cfg["expert"]["epochs"]:
        raise ConfigError(
            f"{source}: safer.regularizer.warmup = {reg['warmup']} must be below expert.epochs = {cfg['expert']['epochs']}"
        )


def claim_metrics(cfg: Mapping[str, Any]) -> list[str]:
    """The metrics-table names of this config (paperflow.safer.claims.metrics_table): "<dataset>/<metric>"."""
    return [f"{d}/{m}" for d in cfg["run_datasets"] for m in CLAIM_METRICS]


def claim_methods(cfg: Mapping[str, Any]) -> list[str]:
    """The evaluation variants of the configured methods."""
    return [v for m in cfg["methods"] for v in VARIANTS[m]]
