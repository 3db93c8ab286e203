"""Out-of-sample metrics of every decision (spec §8), one long table per experiment:
columns seed, method, param, chosen (regression: the validated grid value), metric, value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.credal_dro import newsvendor as nv
from paperflow.credal_dro import regression as rg
from paperflow.credal_dro.bulk import Bulk
from paperflow.credal_dro.tables import features
from paperflow.credal_dro.text import slice_accuracy


def empirical_cvar(errors: np.ndarray, tail_mass: float) -> float:
    """Mean of the largest ceil(tail_mass * n) errors."""
    k = max(int(np.ceil(tail_mass * len(errors))), 1)
    return float(np.mean(np.sort(errors)[-k:]))


def regression_metrics(errors: np.ndarray, unit: float) -> dict[str, float]:
    e = errors / unit
    return {
        "mae": float(e.mean()),
        "rmse": float(np.sqrt(np.mean(e**2))),
        "p98": float(np.quantile(e, 0.98)),
        "cvar2": empirical_cvar(e, 0.02),
    }


def _rows(seed: int, method: str, param: float, chosen: bool, metrics: Mapping[str, float]) -> list[dict]:
    return [
        {"seed": seed, "method": method, "param": param, "chosen": chosen, "metric": k, "value": float(v)}
        for k, v in metrics.items()
    ]


def coverage_rows(splits: Mapping[int, Mapping[str, pd.DataFrame]], bulks: Mapping[str, dict]) -> list[dict]:
    """Bulk certificate (spec §8): the test share inside Xi0 beside the DKW bound 1 - gamma."""
    rows = []
    for seed, parts in splits.items():
        bulk = Bulk.from_json(bulks[str(seed)])
        rows += _rows(
            seed,
            "bulk",
            0.0,
            True,
            {"test_coverage": bulk.contains(features(parts["test"])).mean(), "mass_lower_bound": 1.0 - bulk.gamma},
        )
    return rows


def evaluate(
    exp: str,
    models: Mapping[str, dict],
    splits: Mapping[int, Mapping[str, pd.DataFrame]],
    bulks: Mapping[str, dict],
    cfg: Mapping[str, Any],
) -> pd.DataFrame:
    rows = coverage_rows(splits, bulks)
    for method, doc in models.items():
        for seed_key, res in doc["seeds"].items():
            seed, parts = int(seed_key), splits[int(seed_key)]
            timing = {"runtime_s": res["runtime_s"]}
            if exp == "newsvendor":
                h, b = cfg["costs"]["h"], cfg["costs"]["b"]
                tests = {"clean": features(parts["test"]), "cont": features(parts["test_contaminated"])}
                oracle = {k: nv.cost(np.quantile(t, b / (h + b), axis=0), t, h, b) for k, t in tests.items()}
                for dec in res["decisions"]:
                    m = dict(timing, solve_s=dec["solve_s"])
                    for k, t in tests.items():
                        c = nv.cost(np.asarray(dec["x"]), t, h, b)
                        m |= {f"{k}_mean": c.mean(), f"{k}_std": c.std(), f"{k}_msd": np.mean((c - oracle[k]) ** 2)}
                    rows += _rows(seed, method, dec["param"], True, m)
            elif exp == "regression":
                test = features(parts["test"])
                for fit in res["grid"]:
                    errs = rg.abs_errors(np.asarray(fit["theta"]), fit["theta0"], test)
                    rows += _rows(
                        seed,
                        method,
                        fit["param"],
                        fit["param"] == res["chosen"]["param"],
                        regression_metrics(errs, cfg["unit"]) | timing,
                    )
            else:
                test = parts["test"]
                x = features(test)
                for fit in res["grid"]:
                    acc = slice_accuracy(
                        x @ np.asarray(fit["theta"]) + fit["theta0"], test["label"].to_numpy(), test["group"].to_numpy()
                    )
                    rows += _rows(seed, method, fit["param"], fit["param"] == res["chosen"]["param"], acc | timing)
    return pd.DataFrame(rows)
