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
    claims = cfg["claims"]
    require_member(claims["dataset"], cfg["run_datasets"], source, "claims.dataset")
    for name in [*claims["noniid_partitions"], claims["iid_partition"]]:
        require_member(name, cfg["run_partitions"], source, "claims partitions")
    for method in ("decfus", "dflavg"):
        if method not in cfg["methods"]:
            raise ConfigError(f"{source}: methods must include {method!r} (the claims compare DecFus with DFLAvg)")
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
    if cfg["train"]["rounds"] < claims["tail"] * cfg["train"]["test_round"]:
        raise ConfigError(
            f"{source}: train.rounds = {cfg['train']['rounds']} has fewer than claims.tail = {claims['tail']} evaluations"
        )
