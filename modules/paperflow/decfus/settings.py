"""Config rules of decfus that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_keys, require_member

NEEDS = {
    "digits": ("test_fraction", "split_seed"),
    "cifar10": ("url", "sha256"),
    "cifar100": ("url", "sha256"),
    "svhn": ("train_url", "train_sha256", "test_url", "test_sha256"),
}


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_datasets"]:
        require_member(name, cfg["datasets"], source, "run_datasets[...]")
    for name in cfg["run_partitions"]:
        require_member(name, cfg["partitions"], source, "run_partitions[...]")
    require_member(cfg["claim_dataset"], cfg["run_datasets"], source, "claim_dataset")
    for name, spec in cfg["partitions"].items():
        if spec["kind"] == "dirichlet":
            require_keys(spec, ["beta"], f"{source}: partitions.{name} (kind dirichlet)")
    for name, spec in cfg["datasets"].items():
        require_keys(spec, NEEDS[spec["kind"]], f"{source}: datasets.{name} (kind {spec['kind']})")
    if cfg["train"]["backend"] == "batched" and cfg["model"]["arch"] != "mlp":
        raise ConfigError(
            f"{source}: train.backend = 'batched' runs only model.arch = 'mlp'; use 'looped' for {cfg['model']['arch']!r}"
        )
    d = cfg["decfus"]
    if d["theta1"] > d["theta0"]:
        raise ConfigError(f"{source}: decfus.theta1 = {d['theta1']} must not exceed decfus.theta0 = {d['theta0']}")
    if not d["ref_start"] <= d["ref_end"]:
        raise ConfigError(f"{source}: decfus.ref_start = {d['ref_start']} must be <= decfus.ref_end = {d['ref_end']}")
    tail = cfg["evaluate"]["tail"]
    if cfg["train"]["rounds"] < tail * cfg["train"]["test_round"]:
        raise ConfigError(
            f"{source}: train.rounds = {cfg['train']['rounds']} has fewer than evaluate.tail = {tail} evaluations"
        )


# the evaluate stage's columns (paperflow.decfus.evaluation) and the derived rise, per partition of the claim dataset
EVAL_METRICS = (
    "final_acc",
    "best_acc",
    "final_loss",
    "fused_acc",
    "final_consensus",
    "stable_fraction",
    "theta_final_max",
    "averaged_first",
    "averaged_last",
)
DERIVED_METRICS = ("averaged_rise",)  # averaged_last - averaged_first


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.decfus.claims.metrics_table): "<partition>/<column>"
    for every run partition of the claim dataset."""
    return [f"{p}/{m}" for p in cfg["run_partitions"] for m in (*EVAL_METRICS, *DERIVED_METRICS)]


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The fusion methods this config runs."""
    return list(cfg["methods"])
