"""KL/TV-versus-iteration curves of one (target, path, horizon) from its particle snapshots, and the
N-sample noise floor (N = the run's particle count) per seed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.annealed_langevin.gmm import GMM
from paperflow.annealed_langevin.metrics import noise_floor, panel_metrics, reference
from paperflow.core.config import reject_unknown

FLOOR_SEED_OFFSET = 10_000  # floor samples of seed s use default_rng(FLOOR_SEED_OFFSET + s)


def curves(snapshots: pd.DataFrame, gmm: GMM, gt: np.ndarray, spec: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (seed, iteration, panel): it, t, kl, tv, and the seed's floor_kl / floor_tv. `spec`:
    the target's metric, bins and marginals (null for the density metrics)."""
    reject_unknown(spec, ("metric", "bins", "marginals"), "annealed_langevin metric spec")
    ref = reference(spec["metric"], gmm, gt, list(spec["bins"]), spec["marginals"])
    cols = [c for c in snapshots.columns if c.startswith("x")]
    rows = []
    for seed, by_seed in snapshots.groupby("seed", sort=True):
        n = int((by_seed.it == by_seed.it.min()).sum())
        floor = noise_floor(gmm, ref, n, np.random.default_rng(FLOOR_SEED_OFFSET + int(seed)))
        for (it, t), snap in by_seed.groupby(["it", "t"], sort=True):
            for panel, (kl, tv) in enumerate(panel_metrics(snap[cols].to_numpy(), ref)):
                rows.append(
                    {
                        "seed": int(seed),
                        "it": int(it),
                        "t": float(t),
                        "panel": panel,
                        "kl": kl,
                        "tv": tv,
                        "floor_kl": floor[panel][0],
                        "floor_tv": floor[panel][1],
                        "n_particles": n,
                    }
                )
    return pd.DataFrame(rows)


def final_values(curve: pd.DataFrame) -> pd.DataFrame:
    """Per seed: the last iterate's KL and TV (mean over panels), the floor, the iteration count."""
    last = curve[curve.it == curve.groupby("seed").it.transform("max")]
    return (
        last.groupby("seed")
        .agg(
            kl=("kl", "mean"),
            tv=("tv", "mean"),
            floor_kl=("floor_kl", "mean"),
            floor_tv=("floor_tv", "mean"),
            iterations=("it", "max"),
            t=("t", "max"),
        )
        .reset_index()
    )
