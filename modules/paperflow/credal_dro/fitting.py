"""The train stage of the convex experiments: every seed's decisions for one (experiment, method)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from paperflow.core.resume import row_journal
from paperflow.credal_dro import newsvendor as nv
from paperflow.credal_dro import regression as rg
from paperflow.credal_dro.bulk import Bulk
from paperflow.credal_dro.central import sample_central
from paperflow.credal_dro.tables import features

CENTRAL_SEED_OFFSET = 20_000


def train_convex(
    exp: str,
    method: str,
    splits: Mapping[int, Mapping[str, Any]],
    bulks: Mapping[str, dict],
    cfg: Mapping[str, Any],
    solver: Mapping[str, str],
    seeds: Sequence[int],
    journal: str | Path | None = None,
) -> dict:
    """Every seed's fit of `method` on experiment `exp` (the grid, its selection and the decisions or predictions).
    Each finished seed is a row of the `journal` (a file in the job's checkpoint folder; a scratch file when None),
    its result kept as the JSON text the document gets: a rerun of a killed job takes the finished seeds from it
    and fits only the rest (each seed draws from its own generator), and writes the same document."""
    with row_journal(journal) as done:
        grid = list(cfg["methods"][method])
        out = {"experiment": exp, "method": method, "grid": grid, "seeds": {}}
        for seed in tqdm(seeds, desc=f"{exp}/{method}", mininterval=5):
            if f"seed{seed}" not in done:
                result = _fit_seed(exp, method, grid, splits[seed], bulks[str(seed)], cfg, solver, seed)
                done.append({"id": f"seed{seed}", "result": json.dumps(result)})
            (row,) = done.complete([f"seed{seed}"])
            out["seeds"][str(seed)] = json.loads(row["result"])  # fresh or from before a kill: the same JSON
        return out


def _fit_seed(
    exp: str,
    method: str,
    grid: list,
    parts: Mapping[str, Any],
    bulk_json: dict,
    cfg: Mapping[str, Any],
    solver: Mapping[str, str],
    seed: int,
) -> dict:
    """One seed's fit: the central sample from the seed's own generator, then the method's decisions or fit."""
    bulk = Bulk.from_json(bulk_json)
    rng = np.random.default_rng(CENTRAL_SEED_OFFSET + seed)
    t0 = time.perf_counter()
    if exp == "newsvendor":
        data = np.vstack([features(parts["fit"]), features(parts["select"])])
        central = sample_central(cfg["central"], data, cfg["n_central"] or len(data), rng)
        central_s = time.perf_counter() - t0
        lp = method in ("saa", "saa_trunc", "lv", "cvar")
        result = {
            "decisions": nv.decide(
                method,
                grid,
                central,
                bulk,
                cfg["costs"]["h"],
                cfg["costs"]["b"],
                solver["lp"] if lp else solver["conic"],
            )
        }
    else:
        split = {
            "fit": features(parts["fit"]),
            "select": features(parts["select"]),
            "u_select": parts["select"]["u"].to_numpy(),
        }
        central = sample_central(cfg["central"], split["fit"], cfg["n_central"], rng) if method == "lv" else None
        central_s = time.perf_counter() - t0
        result = rg.fit_method(
            method,
            grid,
            split,
            central,
            bulk,
            {
                "solver": solver["conic"],
                "validation_blocks": cfg["validation_blocks"],
                "or_wass_eta": cfg["or_wass_eta"],
            },
        )
    result["runtime_s"] = time.perf_counter() - t0
    result["central_s"] = central_s
    result["n_central_in_bulk"] = int(bulk.contains(central).sum()) if central is not None else None
    return result
