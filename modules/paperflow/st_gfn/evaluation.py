"""Metrics of spec section 8 against the exact target pi = R / Z (enumerated by torchgfn's HyperGrid)."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from paperflow.st_gfn.identities import identity_gaps
from paperflow.st_gfn.models import make_gflownet
from paperflow.st_gfn.sampling import make_sampler

EVAL_SEED_OFFSET = 20_000  # fresh on-policy samples of seed s use torch seed s + this
UNIFORM = "uniform"        # the uniform-policy sampler (every valid action equally likely)
IDENTITY = "identity"      # rows of the same-batch loss identities (spec 7 (ii))
IDENTITY_BATCH = 16


def empirical_pmf(states: np.ndarray, n_states: int) -> np.ndarray:
    counts = np.bincount(np.asarray(states, dtype=np.int64), minlength=n_states).astype(np.float64)
    return counts / max(counts.sum(), 1.0)


def l1_mean(p_hat: np.ndarray, pi: np.ndarray) -> float:
    """torchgfn's convention: mean over states of |p_hat - pi|."""
    return float(np.abs(p_hat - pi).mean())


def total_variation(p_hat: np.ndarray, pi: np.ndarray) -> float:
    """sum |p_hat - pi| / 2 = l1_mean * |X| / 2."""
    return float(np.abs(p_hat - pi).sum() / 2)


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> float:
    m = (p + q) / 2

    def kl(a: np.ndarray, b: np.ndarray) -> float:
        nz = a > 0
        return float((a[nz] * np.log(a[nz] / b[nz])).sum())

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def sample_terminal_states(env, pf, n: int, batch: int, epsilon: float, seed: int) -> np.ndarray:
    """Indices of n terminal states sampled with P_F (epsilon = 1: the uniform-policy sampler)."""
    torch.manual_seed(seed)
    sampler = make_sampler(env, pf)
    out = []
    with torch.no_grad():
        for start in range(0, n, batch):
            trajectories = sampler.sample_trajectories(env, n=min(batch, n - start), epsilon=epsilon)
            out.append(env.get_states_indices(trajectories.terminating_states).numpy())
    return np.concatenate(out)


def sample_efficiency(visits: pd.DataFrame, pi: np.ndarray, window: int, threshold: float, stride: int) -> float:
    """Trajectories sampled until the L1 of the last `window` visited states first drops below threshold."""
    states = visits.sort_values("iteration")["state"].to_numpy()
    for end in range(window, states.size + 1, stride):
        if l1_mean(empirical_pmf(states[end - window:end], pi.size), pi) < threshold:
            return float(end)
    return math.nan


def method_metrics(env, pi: np.ndarray, modes: np.ndarray, visits: pd.DataFrame, history: pd.DataFrame,
                   cfg: Mapping[str, Any]) -> dict[str, float]:
    last = visits.sort_values("iteration")["state"].to_numpy()[-int(cfg["last_visited"]):]
    p_hat = empirical_pmf(last, pi.size)
    found = np.unique(visits["state"].to_numpy())
    losses = history.sort_values("iteration")["loss"].to_numpy()
    return {
        "l1": l1_mean(p_hat, pi),
        "tv": total_variation(p_hat, pi),
        "jsd": jensen_shannon(p_hat, pi),
        "modes_found": float(modes[found].sum()),
        "modes_total": float(modes.sum()),
        "loss_std_last": float(np.std(losses[-int(cfg["loss_window"]):], ddof=1)),
        "trajectories_to_l1": sample_efficiency(visits, pi, int(cfg["last_visited"]), float(cfg["efficiency_l1"]),
                                                int(cfg["efficiency_stride"])),
    }


def evaluate_env(env, target: pd.DataFrame, methods: Mapping[str, Mapping[str, Any]],
                 runs: Iterable[tuple[str, int, str, pd.DataFrame, pd.DataFrame]],
                 model: Mapping[str, Any], seeds: Iterable[int], cfg: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Long metrics table (method, seed, metric, value) and the pmfs (exact, per method for the first seed).
    `target` is the preprocessed exact target; `runs` yields (method, seed, checkpoint path, visits, history)."""
    pi, modes = target["pi"].to_numpy(), target["is_mode"].to_numpy()
    rows, pmfs = [], {"state": np.arange(pi.size), "exact": pi}
    log_z_true = float(np.log(target["reward"].sum()))
    first_seed = None
    for method, seed, ckpt, visits, history in runs:
        first_seed = seed if first_seed is None else first_seed
        gfn = make_gflownet(env, methods[method], model)
        gfn.load_state_dict(torch.load(ckpt, map_location="cpu")[f"seed{seed}"])
        values = method_metrics(env, pi, modes, visits, history, cfg)
        fresh = sample_terminal_states(env, gfn.pf, int(cfg["n_eval_samples"]), int(cfg["eval_batch"]), 0.0,
                                       seed + EVAL_SEED_OFFSET)
        values["l1_on_policy"] = l1_mean(empirical_pmf(fresh, pi.size), pi)
        if getattr(gfn, "logZ", None) is not None:
            values["logz_abs_err"] = abs(float(gfn.logZ.detach()) - log_z_true)
        rows += [{"method": method, "seed": seed, "metric": k, "value": v} for k, v in values.items()]
        if seed == first_seed:
            pmfs[method] = empirical_pmf(visits.sort_values("iteration")["state"].to_numpy()[-int(cfg["last_visited"]):], pi.size)
    for seed in seeds:
        any_method = next(iter(methods))
        reference = make_gflownet(env, methods[any_method], model)
        uniform = sample_terminal_states(env, reference.pf, int(cfg["last_visited"]), int(cfg["eval_batch"]), 1.0,
                                         seed + EVAL_SEED_OFFSET)
        p_u = empirical_pmf(uniform, pi.size)
        rows += [{"method": UNIFORM, "seed": seed, "metric": "l1", "value": l1_mean(p_u, pi)},
                 {"method": UNIFORM, "seed": seed, "metric": "tv", "value": total_variation(p_u, pi)}]
        if seed == first_seed:
            pmfs[UNIFORM] = p_u
        gaps = identity_gaps(env, int(model["hidden"]), int(model["layers"]), IDENTITY_BATCH, seed + EVAL_SEED_OFFSET)
        rows += [{"method": IDENTITY, "seed": seed, "metric": k, "value": v} for k, v in gaps.items()]
    return pd.DataFrame(rows), pd.DataFrame(pmfs)

