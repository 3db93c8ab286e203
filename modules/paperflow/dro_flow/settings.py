"""Config rules of dro_flow that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError, reject_unknown, require_keys, require_member

NEEDS = {
    "uls": ("dim", "n_train", "n_test", "matrix_seed", "stream"),
    "circle": ("n_train", "n_test"),
    "moons": ("n_train", "n_test", "noise", "imbalance_ratio"),
    "digits": ("test_fraction",),
    "cifar10": ("images_url", "images_sha256", "weights_url", "weights_sha256", "head_seed", "batch_size"),
}
EVALUATE_NEEDS = {
    "shift": ("delta_max", "delta_steps"),
    "attack": ("norm", "radii", "radius_relative", "pgd_steps", "pgd_alpha"),
}


def check(cfg: dict[str, Any], source: str) -> None:
    for name in cfg["run_datasets"]:
        require_member(name, cfg["datasets"], source, "run_datasets[...]")
    require_member(cfg["claim"]["dataset"], cfg["run_datasets"], source, "claim.dataset")
    for name, spec in cfg["datasets"].items():
        where = f"{source}: datasets.{name}"
        data_where = f"{where}.data (kind {spec['kind']})"
        require_keys(spec["data"], NEEDS[spec["kind"]], data_where)
        reject_unknown(spec["data"], NEEDS[spec["kind"]], data_where)
        evaluate_keys = ("kind", *EVALUATE_NEEDS[spec["evaluate"]["kind"]])
        evaluate_where = f"{where}.evaluate (kind {spec['evaluate']['kind']})"
        require_keys(spec["evaluate"], evaluate_keys, evaluate_where)
        reject_unknown(spec["evaluate"], evaluate_keys, evaluate_where)
        expected = "shift" if spec["kind"] == "uls" else "attack"
        if spec["evaluate"]["kind"] != expected:
            raise ConfigError(
                f"{where}.evaluate.kind = {spec['evaluate']['kind']!r}; a {spec['kind']} dataset is evaluated by {expected!r}"
            )
        if (spec["model"]["kind"] == "linear_ls") != (spec["kind"] == "uls"):
            raise ConfigError(
                f"{where}.model.kind = {spec['model']['kind']!r} does not fit kind {spec['kind']!r} (linear_ls is for uls only)"
            )
        if spec["model"]["kind"] == "mlp" and "hidden" not in spec["model"]:
            raise ConfigError(f"{where}.model: kind mlp needs `hidden` (a list of widths, [] for a linear model)")
        dro = spec["dro"]
        if "wfr" in spec["methods"] and dro["lam"] * dro["eps"] * dro["weight_lr"] >= 1:
            raise ConfigError(
                f"{where}.dro: lam * eps * weight_lr = {dro['lam'] * dro['eps'] * dro['weight_lr']:g} must be < 1 (else the Fisher-Rao step flips the sign of log w)"
            )
        if "rgo" in spec["methods"]:
            unset = [k for k in ("rgo_smoothness", "rgo_trials") if dro[k] is None]
            if unset:
                raise ConfigError(f"{where}.dro: method rgo needs {' and '.join(unset)} (null here)")
            if 2 * dro["lam"] <= dro["rgo_smoothness"]:
                raise ConfigError(
                    f"{where}.dro: method rgo needs lam > rgo_smoothness / 2 (lam = {dro['lam']}, rgo_smoothness = {dro['rgo_smoothness']}): the proposal variance lam eps / (2 lam - L) would be negative"
                )


CONTROL_ARMS = ("noise",)  # trained as methods, left out of best_other (the claims' controls)
BEST_OTHER = "best_other"  # per seed, the lowest value over a shift dataset's methods other than ERM and the controls


def shift_metrics(dataset: str) -> list[str]:
    """The metrics-table names of a shift dataset (paperflow.dro_flow.claims.metrics_table)."""
    return [
        f"{dataset}/test_loss@delta0",
        f"{dataset}/test_loss_mean@large_window",
        f"{dataset}/test_loss_mean@small_window",
    ]


def attack_metrics(dataset: str, radii: list[float]) -> list[str]:
    """The metrics-table names of an attack dataset: clean accuracy, FGSM and PGD accuracy per radius."""
    return [f"{dataset}/clean_acc"] + [f"{dataset}/{m}@{r:g}" for r in radii for m in ("fgsm_acc", "pgd_acc")]


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """Every metric name this config's metrics table holds."""
    names = []
    for name in cfg["run_datasets"]:
        spec = cfg["datasets"][name]
        if spec["evaluate"]["kind"] == "shift":
            names += shift_metrics(name)
        else:
            names += attack_metrics(name, spec["evaluate"]["radii"])
    return names


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """The methods trained on some run dataset, and best_other where a shift dataset runs."""
    specs = [cfg["datasets"][n] for n in cfg["run_datasets"]]
    methods = {m for spec in specs for m in spec["methods"]}
    if any(spec["evaluate"]["kind"] == "shift" for spec in specs):
        methods.add(BEST_OTHER)
    return sorted(methods)
