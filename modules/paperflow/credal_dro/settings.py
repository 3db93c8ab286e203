"""Config rules of credal_dro that its JSON schema cannot express (cross-references between keys)."""

from __future__ import annotations

from typing import Any

from paperflow.core.config import ConfigError

EXPERIMENTS = ("newsvendor", "regression", "text")


def seeds_of(cfg: dict[str, Any], exp: str) -> list[int]:
    return list(cfg[exp]["seeds"] or cfg["seeds"])


def check(cfg: dict[str, Any], source: str) -> None:
    nv = cfg["newsvendor"]
    if "newsvendor" in cfg["experiments"]:
        for key in ("saa", "saa_trunc", "lv"):
            if key not in nv["methods"]:
                raise ConfigError(
                    f"{source}: newsvendor.methods must include '{key}' (the claims compare LV with truncated and plain SAA)"
                )
        if nv["bulk"]["geometry"] != "box":
            raise ConfigError(
                f"{source}: newsvendor.bulk.geometry must be 'box' (the LP and the in-bulk spikes use the box corners)"
            )
        lo, hi = nv["contamination"]["spike"]
        if lo > hi:
            raise ConfigError(f"{source}: newsvendor.contamination.spike = [{lo}, {hi}] must be increasing")
    if cfg["text"]["encoder"]["device"] == "cuda" and cfg["resources"]["gpus"] == 0:
        raise ConfigError(f"{source}: text.encoder.device = 'cuda' needs resources.gpus >= 1")


METRICS = {  # per experiment, the metrics of paperflow.credal_dro.evaluation (timings left out)
    "newsvendor": [f"{t}_{s}" for t in ("cont", "clean") for s in ("mean", "std", "msd")]
    + ["best_cont_mean", "clean_mean_min_step"],
    "regression": ["mae", "rmse", "p98", "cvar2"],
    "text": ["avg_acc", "worst_slice_acc"],
}
NEWSVENDOR_DERIVED = ("lv", "cvar", "kl")  # methods with newsvendor best_cont_mean / clean_mean_min_step rows


def claim_metrics(cfg: dict[str, Any]) -> list[str]:
    """The metrics-table names this config produces (paperflow.credal_dro.claims.metrics_table)."""
    names = []
    for exp in cfg["experiments"]:
        names += [f"{exp}/{m}" for m in (*METRICS[exp], "test_coverage")]
    if "regression" in cfg["experiments"] and cfg["regression"]["source"] == "california":
        names.append("california/mae")
    return names


def claim_methods(cfg: dict[str, Any]) -> list[str]:
    """Every method at every grid value ("lv@0.1"), the validated choices of the regression and text ("lv"), the
    newsvendor's derived rows ("lv", "cvar", "kl"), and the bulk certificate ("bulk", "dkw_bound")."""
    names = {"bulk", "dkw_bound"}
    for exp in cfg["experiments"]:
        for method, grid in cfg[exp]["methods"].items():
            names.update(f"{method}@{p:g}" for p in grid)
            if exp != "newsvendor" or method in NEWSVENDOR_DERIVED:
                names.add(method)
    return sorted(names)
