"""Config rules of ph_vae that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, require_keys, require_member

NEEDS = {
    "marginal": ("marginal", "n"),
    "t_copula": ("marginals", "n", "rho", "df", "correlation"),
    "danish_surrogate": ("n", "shape", "scale"),
    "download": ("url", "sha256", "rescale"),
}


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_datasets"]:
        require_member(name, cfg["datasets"], source, "run_datasets[...]")
    require_member(cfg["claim_dataset"], cfg["run_datasets"], source, "claim_dataset")
    devices, gpus = cfg["train"]["devices"], cfg["resources"]["gpus"]
    if gpus and devices != gpus:
        raise ConfigError(
            f"{source}: train.devices = {devices} but resources.gpus = {gpus}; DDP uses one GPU per device, set them equal"
        )
    if cfg["train"]["batch_size"] % devices:
        raise ConfigError(
            f"{source}: train.batch_size = {cfg['train']['batch_size']} must be divisible by train.devices = {devices}"
        )
    for name, spec in cfg["datasets"].items():
        require_keys(spec, NEEDS[spec["kind"]], f"{source}: datasets.{name} (kind {spec['kind']})")


MULTIVARIATE_ONLY = ("ph_indep",)  # one PH-VAE per coordinate: on 1-D data it is the `ph` decoder itself


def dataset_dim(spec: dict[str, Any]) -> int:
    """Number of coordinates of a dataset: one per marginal of a t-copula, else 1."""
    return len(spec["marginals"]) if spec["kind"] == "t_copula" else 1


def decoders_for(cfg: dict[str, Any], dataset: str) -> list[str]:
    """The decoders trained on `dataset`: all of `decoders`, less the multivariate-only ones on 1-D data."""
    multivariate = dataset_dim(cfg["datasets"][dataset]) > 1
    return [d for d in cfg["decoders"] if multivariate or d not in MULTIVARIATE_ONLY]


TAIL_METRICS = ("q99_rel", "q95_rel", "neg_frac")
JOINT_METRICS = ("test_kl", "test_nelbo_per_dim")
DEPENDENCE_METRICS = ("coexc_abs_err@0.95", "kendall_tau_mae", "corr_log1p_frobenius")


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.ph_vae.claims.metrics_table): per run dataset,
    the tail metrics of dim 0, the test terms of the joint model, and the dependence metrics where multivariate."""
    names = []
    for name in cfg["run_datasets"]:
        tail = (f"ks_tail@{cfg['evaluate']['tail_q']:g}", *TAIL_METRICS)
        names += [f"{name}/{m}/dim0" for m in tail] + [f"{name}/{m}/joint" for m in JOINT_METRICS]
        if dataset_dim(cfg["datasets"][name]) > 1:
            names += [f"{name}/{m}/joint" for m in DEPENDENCE_METRICS]
    return names


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The decoders this config trains on some dataset."""
    return sorted({d for name in cfg["run_datasets"] for d in decoders_for(cfg, name)})
