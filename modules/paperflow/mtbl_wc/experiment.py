"""Train and evaluate: build the torch problem from a preprocessed instance, run a method over the
preference grid, and turn runs into per-(method, seed, preference) metrics (spec §8)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.config import reject_unknown
from paperflow.core.training import make_fabric, make_loggers
from paperflow.mtbl_wc import data
from paperflow.mtbl_wc.algorithm import RunResult, measure, run
from paperflow.mtbl_wc.problems import ConcaveECMO, HyperCleaning, Problem, QuadraticECMO, as_tensor

PRECISION = "64-true"  # the Fabric's: the problems and the loop are float64 throughout


def build_problem(kind: str, inst: dict[str, np.ndarray], dev: torch.device | str = "cpu") -> Problem:
    if kind == "quadratic":
        return QuadraticECMO.from_arrays(inst, dev)
    if kind == "concave":
        return ConcaveECMO.from_arrays(inst, dev)
    k = int(max(inst["labels_val"].max(), inst["noisy_labels"].max())) + 1
    return HyperCleaning(
        as_tensor(inst["phi_train"], dev),
        as_tensor(data.one_hot(inst["noisy_labels"], k), dev),
        as_tensor(inst["phi_val"], dev),
        as_tensor(data.one_hot(inst["labels_val"], k), dev),
        as_tensor(data.task_masks(inst["labels_val"], [list(g) for g in inst["groups"]]), dev),
    )


def starting_point(kind: str, problem: Problem, inst: dict[str, np.ndarray], n_prefs: int, seed: int) -> np.ndarray:
    """Synthetic: one seeded Gaussian point for every preference. Hyper-cleaning: the feasible warm
    start x = 0 (weights 0.5) and W = the minimum-norm least-squares fit with uniform weights."""
    if kind in ("quadratic", "concave"):
        z0 = np.random.default_rng(seed).normal(size=problem.dim_x + problem.dim_y)
    else:
        targets = data.one_hot(inst["noisy_labels"], problem.k)
        w0 = np.linalg.lstsq(inst["phi_train"], targets, rcond=None)[0]
        z0 = np.concatenate([np.zeros(problem.dim_x), w0.ravel()])
    return np.tile(z0, (n_prefs, 1))


def reference_point(solver: dict[str, Any], inst: dict[str, np.ndarray]) -> np.ndarray:
    return inst["ideal"] if solver["f_ref"] == "ideal" else np.zeros(inst["prefs"].shape[1])


SOLVER_KEYS = (
    "steps",
    "rho0",
    "rho_max",
    "ramp",
    "tau",
    "eta0",
    "x_step",
    "eval_every",
    "chebyshev",
    "penalty_grad",
    "f_ref",
    "output",
    "noise_std",
    "decay_steps",
)


def train(
    kind: str,
    method: str,
    insts: Mapping[int, dict[str, np.ndarray]],
    solver: dict[str, Any],
    run_dir: str | Path,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    checkpoint_dir: str | Path | None = None,
) -> dict[int, RunResult]:
    """Every seed's run ({seed: instance}) of one method under Lightning Fabric, its evaluations logged to
    run_dir/csv/<name>/metrics.csv (and wandb when enabled). The concave instances of all seeds run as one stacked
    tensor program (one row per seed and preference, name `seeds`; the rows do not interact), every other kind
    seed by seed (name `seed<seed>`). `checkpoint_dir`: the job's checkpoint folder, where each run saves its state
    (checkpoint_dir/<name>) and resumes from."""
    reject_unknown(solver, SOLVER_KEYS, "mtbl_wc solver")

    def folder(name: str) -> Path | None:
        return None if checkpoint_dir is None else Path(checkpoint_dir) / name

    if kind == "concave":
        return _train_stacked(method, insts, solver, make_loggers(run_dir, "seeds", wandb, tags or {}), folder("seeds"))
    runs = {}
    for seed, inst in insts.items():
        fabric = make_fabric(make_loggers(run_dir, f"seed{seed}", wandb, tags or {}), precision=PRECISION)
        fabric.seed_everything(seed)
        problem = build_problem(kind, inst, fabric.device)
        z0 = starting_point(kind, problem, inst, len(inst["prefs"]), seed)
        f_ref = reference_point(solver, inst)
        runs[seed] = run(
            problem, method, inst["prefs"], z0, f_ref, solver, seed, fabric, checkpoint_dir=folder(f"seed{seed}")
        )
    return runs


def _train_stacked(
    method: str, insts: Mapping[int, dict], solver: dict[str, Any], loggers: list, checkpoint_dir: Path | None
) -> dict:
    seeds = list(insts)
    n_prefs = len(insts[seeds[0]]["prefs"])
    fabric = make_fabric(loggers, precision=PRECISION)
    fabric.seed_everything(seeds[0])
    problem = ConcaveECMO.stack([insts[s] for s in seeds], n_prefs, fabric.device)
    z0 = np.concatenate([starting_point("concave", problem, insts[s], n_prefs, s) for s in seeds])
    result = run(
        problem,
        method,
        np.concatenate([insts[s]["prefs"] for s in seeds]),
        z0,
        np.concatenate([np.tile(reference_point(solver, insts[s]), (n_prefs, 1)) for s in seeds]),
        solver,
        seeds[0],
        fabric,
        labels=[f"seed{s}/pref{i}" for s in seeds for i in range(n_prefs)],
        checkpoint_dir=checkpoint_dir,
    )
    runs = {}
    for k, seed in enumerate(seeds):
        rows = slice(k * n_prefs, (k + 1) * n_prefs)
        hist = result.history[result.history.pref.between(rows.start, rows.stop - 1)]
        runs[seed] = RunResult(
            z_best=result.z_best[rows],
            z_final=result.z_final[rows],
            history=hist.assign(pref=hist.pref - rows.start).reset_index(drop=True),
        )
    return runs


def angle_to_ray(f: np.ndarray, f_ref: np.ndarray, prefs: np.ndarray) -> np.ndarray:
    """Degrees between f - f_ref and the WC ray direction (1 / r_1, ..., 1 / r_S)."""
    a, d = f - f_ref, 1.0 / prefs
    cos = np.sum(a * d, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(d, axis=1))
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def hypervolume_2d(points: np.ndarray, ref: np.ndarray) -> float:
    """Area dominated by `points` (minimisation) and bounded by `ref`."""
    pts = points[np.all(points < ref, axis=1)]
    if len(pts) == 0:
        return 0.0
    pts = pts[np.argsort(pts[:, 0])]
    area, best2 = 0.0, ref[1]
    for (x1, x2), nxt in zip(pts, np.append(pts[1:, 0], ref[0])):
        best2 = min(best2, x2)
        area += (nxt - x1) * (ref[1] - best2)
    return float(area)


def synthetic_metrics(
    kind: str, inst, z: np.ndarray, history: pd.DataFrame, checkpoints: list[int] | None
) -> dict[str, np.ndarray]:
    """The metrics of a synthetic run; K_best at each of `checkpoints` (None for a problem without a rate claim)."""
    problem = build_problem(kind, inst)
    zt = torch.as_tensor(z, dtype=torch.float64)
    with torch.no_grad():
        f = problem.objectives(zt).numpy()
    k = measure(problem, zt)
    prefs, ideal = inst["prefs"], inst["ideal"]
    gaps = prefs * (f - ideal)
    out = {
        "rel_dist_wc": np.linalg.norm(z - inst["z_wc"], axis=1) / np.linalg.norm(inst["z_wc"], axis=1),
        "rel_dist_wc_f": np.linalg.norm(f - inst["f_wc"], axis=1) / np.linalg.norm(inst["f_wc"] - ideal, axis=1),
        "h_norm": np.sqrt(k.feasibility),
        "K": k.value,
        "angle_deg": angle_to_ray(f, ideal, prefs),
        "cheb_gap": gaps.max(1) - gaps.min(1),
        "min_f_rel": (f - ideal).min(1) / (inst["front"] - ideal).max(),
        "f1": f[:, 0],
        "f2": f[:, 1],
    }
    by_step = history.pivot(index="step", columns="pref", values="K_best")
    for c in checkpoints if checkpoints is not None else []:
        if c in by_step.index:
            out[f"K_best@{c}"] = by_step.loc[c].to_numpy()
    return out


def cleaning_metrics(inst, z: np.ndarray) -> dict[str, np.ndarray]:
    problem = build_problem("digits", inst)
    zt = torch.as_tensor(z, dtype=torch.float64)
    with torch.no_grad():
        f = problem.objectives(zt).numpy()
        h = problem.constraint(zt).numpy()
    w = z[:, problem.dim_x :].reshape(len(z), problem.p, problem.k)
    pred = np.argmax(inst["phi_test"] @ w, axis=-1)
    right = pred == inst["labels_test"]
    flagged = z[:, : problem.dim_x] < 0.0  # weight sigmoid(x_i) below the uniform start's 0.5
    flipped = inst["flipped"].astype(bool)
    tp = (flagged & flipped).sum(1)
    groups = [np.isin(inst["labels_test"], g) for g in inst["groups"]]
    return {
        "f1": f[:, 0],
        "f2": f[:, 1],
        "max_f": f.max(1),
        "h_norm": np.linalg.norm(h, axis=1),
        "test_acc": right.mean(1),
        **{f"test_acc_task{i + 1}": right[:, g].mean(1) for i, g in enumerate(groups)},
        "detect_f1": 2 * tp / np.maximum(flagged.sum(1) + flipped.sum(), 1),
        "flagged_frac": flagged.mean(1),
    }


def evaluate(
    kind: str,
    insts: dict[int, dict],
    runs: dict[tuple[str, int], dict],
    histories: pd.DataFrame,
    output: str,
    checkpoints: list[int] | None,
) -> pd.DataFrame:
    """Long table: method, seed, pref (index), r1, metric, value; plus hypervolume per (method, seed)."""
    rows = []
    for (method, seed), arrays in runs.items():
        inst = insts[seed]
        z = arrays["z_best" if output == "best" else "z_final"]
        hist = histories[(histories.method == method) & (histories.seed == seed)]
        metrics = (
            synthetic_metrics(kind, inst, z, hist, checkpoints)
            if kind in ("quadratic", "concave")
            else cleaning_metrics(inst, z)
        )
        for name, values in metrics.items():
            rows += [
                {
                    "method": method,
                    "seed": seed,
                    "pref": i,
                    "r1": float(inst["prefs"][i, 0]),
                    "metric": name,
                    "value": float(v),
                }
                for i, v in enumerate(values)
            ]
    frame = pd.DataFrame(rows)
    if kind in ("quadratic", "concave"):
        pts = frame[frame.metric.isin(["f1", "f2"])].pivot_table(
            index=["method", "seed", "pref"], columns="metric", values="value"
        )
        for seed in insts:
            ref = 1.1 * pts.loc[pd.IndexSlice[:, seed, :], :].to_numpy().max(0)
            for method in pts.index.get_level_values(0).unique():
                sel = pts.loc[(method, seed)].to_numpy()
                rows.append(
                    {
                        "method": method,
                        "seed": seed,
                        "pref": -1,
                        "r1": np.nan,
                        "metric": "hypervolume",
                        "value": hypervolume_2d(sel, ref),
                    }
                )
        frame = pd.DataFrame(rows)
    return frame
