"""Metrics of spec section 8: on enumerable envs (HyperGrid, gene sets) against the exact target pi = R / Z;
on sequence envs (BitSequence) reference modes found, top-k reward and diversity; on games optimal moves and
win / draw / loss rates (`paperflow.st_gfn.game_evaluation`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.st_gfn.envs import terminal_record
from paperflow.st_gfn.games import GAME_KINDS
from paperflow.st_gfn.identities import identity_gaps
from paperflow.st_gfn.models import make_gflownet
from paperflow.st_gfn.sampling import make_sampler
from paperflow.st_gfn.sequences import sequence_metrics
from paperflow.st_gfn.settings import ENUMERABLE, known_keys

EVAL_SEED_OFFSET = 20_000  # fresh on-policy samples of seed s use torch seed s + this
UNIFORM = "uniform"  # the uniform-policy sampler (every valid action equally likely)
UNTRAINED = "untrained"  # the policy network at initialisation, sampled on-policy (the control of "below uniform")
IDENTITY = "identity"  # rows of the same-batch loss identities (spec 7 (ii))
IDENTITY_FILTERED = "identity_filtered"  # the same gaps with the low-pass filter in place (their control)
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


def sample_terminal(env, pf, n: int, batch: int, epsilon: float, seed: int) -> pd.DataFrame:
    """n terminal states sampled with P_F (epsilon = 1: the uniform-policy sampler), as `terminal_record` columns."""
    torch.manual_seed(seed)
    sampler = make_sampler(env, pf)
    out = []
    with torch.no_grad():
        for start in range(0, n, batch):
            trajectories = sampler.sample_trajectories(env, n=min(batch, n - start), epsilon=epsilon)
            out.append(pd.DataFrame(terminal_record(env, trajectories.terminating_states)))
    return pd.concat(out, ignore_index=True)


def sample_terminal_states(env, pf, n: int, batch: int, epsilon: float, seed: int) -> np.ndarray:
    """Indices of n terminal states of an enumerable env sampled with P_F."""
    return sample_terminal(env, pf, n, batch, epsilon, seed)["state"].to_numpy()


def sample_efficiency(visits: pd.DataFrame, pi: np.ndarray, window: int, threshold: float, stride: int) -> float:
    """Trajectories sampled until the L1 of the last `window` visited states first drops below threshold."""
    states = visits.sort_values("iteration")["state"].to_numpy()
    for end in range(window, states.size + 1, stride):
        if l1_mean(empirical_pmf(states[end - window : end], pi.size), pi) < threshold:
            return float(end)
    return math.nan


def method_metrics(
    env, pi: np.ndarray, modes: np.ndarray, visits: pd.DataFrame, history: pd.DataFrame, cfg: Mapping[str, Any]
) -> dict[str, float]:
    last = visits.sort_values("iteration")["state"].to_numpy()[-int(cfg["last_visited"]) :]
    p_hat = empirical_pmf(last, pi.size)
    found = np.unique(visits["state"].to_numpy())
    losses = history.sort_values("iteration")["loss"].to_numpy()
    return {
        "l1": l1_mean(p_hat, pi),
        "tv": total_variation(p_hat, pi),
        "jsd": jensen_shannon(p_hat, pi),
        "modes_found": float(modes[found].sum()),
        "modes_total": float(modes.sum()),
        "loss_std_last": float(np.std(losses[-int(cfg["loss_window"]) :], ddof=1)),
        "trajectories_to_l1": sample_efficiency(
            visits, pi, int(cfg["last_visited"]), float(cfg["efficiency_l1"]), int(cfg["efficiency_stride"])
        ),
    }


def word_columns(frame: pd.DataFrame) -> np.ndarray:
    return frame[[c for c in frame.columns if c.startswith("w") and c[1:].isdigit()]].to_numpy()


def sequence_run_metrics(
    visits: pd.DataFrame, history: pd.DataFrame, modes: np.ndarray, spec: Mapping[str, Any], cfg: Mapping[str, Any]
) -> dict[str, float]:
    """Modes found, top-k reward and diversity over every visited sequence of training; loss std."""
    losses = history.sort_values("iteration")["loss"].to_numpy()
    values = sequence_metrics(word_columns(visits), modes, spec, cfg)
    values["loss_std_last"] = float(np.std(losses[-int(cfg["loss_window"]) :], ddof=1))
    return values


def identity_rows(gaps: Mapping[str, float], seed: int) -> list[dict[str, Any]]:
    """Rows of the identity gaps: `identity` for the identities, `identity_filtered` (same metric names) for the
    gaps with the filter of identities.FILTERED_LAM in place of lam = 0 and of the DC-only weighting."""
    rows = []
    for k, v in gaps.items():
        if k.startswith("filtered_"):
            metric = {"filtered_db_gap": "lam0_db_gap", "filtered_tb_gap": "dc_tb_gap"}[k]
            rows.append({"method": IDENTITY_FILTERED, "seed": seed, "metric": metric, "value": v})
        else:
            rows.append({"method": IDENTITY, "seed": seed, "metric": k, "value": v})
    return rows


def evaluate_env(
    env,
    spec: Mapping[str, Any],
    target: pd.DataFrame,
    methods: Mapping[str, Mapping[str, Any]],
    runs: Iterable[tuple[str, int, str, pd.DataFrame, pd.DataFrame]],
    model: Mapping[str, Any],
    seeds: Iterable[int],
    cfg: Mapping[str, Any],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Long metrics table (method, seed, metric, value) and the pmfs (exact, per method for the first seed; empty
    for sequence envs). `target` is the preprocessed target (exact pmf, or the reference modes of a sequence
    env); `runs` yields (method, seed, checkpoint path, visits, history). Every env also gets the uniform
    sampler's rows and the same-batch loss identities. Game envs: `game_evaluation.evaluate_game`."""
    known_keys("evaluate", cfg)
    if spec["kind"] in GAME_KINDS:
        from paperflow.st_gfn.game_evaluation import evaluate_game  # imports this module's constants

        return evaluate_game(env, spec, target, methods, runs, model, seeds, cfg)
    enumerable = spec["kind"] in ENUMERABLE
    rows = []
    pmfs: dict[str, Any] = {"state": np.arange(len(target)), "exact": target["pi"].to_numpy()} if enumerable else {}
    seeds = list(seeds)
    first_seed = seeds[0]
    for method, seed, ckpt, visits, history in runs:
        gfn = make_gflownet(env, methods[method], model)
        gfn.load_state_dict(torch.load(ckpt, map_location="cpu")[f"seed{seed}"])
        if enumerable:
            values = enumerable_metrics(env, target, gfn, visits, history, cfg, seed)
            if seed == first_seed:
                last = visits.sort_values("iteration", kind="stable")["state"].to_numpy()[-int(cfg["last_visited"]) :]
                pmfs[method] = empirical_pmf(last, len(target))
        else:
            values = sequence_run_metrics(visits, history, target.to_numpy(), spec, cfg)
        rows += [{"method": method, "seed": seed, "metric": k, "value": v} for k, v in values.items()]
    for seed in seeds:
        reference = make_gflownet(env, methods[next(iter(methods))], model)
        uniform = sample_terminal(
            env, reference.pf, int(cfg["last_visited"]), int(cfg["eval_batch"]), 1.0, seed + EVAL_SEED_OFFSET
        )
        torch.manual_seed(seed)
        untrained_net = make_gflownet(env, methods[next(iter(methods))], model)
        untrained = sample_terminal(
            env, untrained_net.pf, int(cfg["last_visited"]), int(cfg["eval_batch"]), 0.0, seed + EVAL_SEED_OFFSET
        )
        for name, sampled in ((UNIFORM, uniform), (UNTRAINED, untrained)):
            if enumerable:
                pi = target["pi"].to_numpy()
                p_u = empirical_pmf(sampled["state"].to_numpy(), pi.size)
                values = {"l1": l1_mean(p_u, pi), "tv": total_variation(p_u, pi)}
                if seed == first_seed and name == UNIFORM:
                    pmfs[UNIFORM] = p_u
            else:
                values = sequence_metrics(word_columns(sampled), target.to_numpy(), spec, cfg)
            rows += [{"method": name, "seed": seed, "metric": k, "value": v} for k, v in values.items()]
        gaps = identity_gaps(env, int(model["hidden"]), int(model["layers"]), IDENTITY_BATCH, seed + EVAL_SEED_OFFSET)
        rows += identity_rows(gaps, seed)
    return pd.DataFrame(rows), pd.DataFrame(pmfs)


def enumerable_metrics(
    env, target: pd.DataFrame, gfn, visits: pd.DataFrame, history: pd.DataFrame, cfg: Mapping[str, Any], seed: int
) -> dict[str, float]:
    """Spec 8 against the exact target, plus on-policy L1 from fresh samples and |log Z_hat - log Z|."""
    pi, modes = target["pi"].to_numpy(), target["is_mode"].to_numpy()
    values = method_metrics(env, pi, modes, visits, history, cfg)
    fresh = sample_terminal_states(
        env, gfn.pf, int(cfg["n_eval_samples"]), int(cfg["eval_batch"]), 0.0, seed + EVAL_SEED_OFFSET
    )
    values["l1_on_policy"] = l1_mean(empirical_pmf(fresh, pi.size), pi)
    if getattr(gfn, "logZ", None) is not None:
        values["logz_abs_err"] = abs(float(gfn.logZ.detach()) - float(np.log(target["reward"].sum())))
    return values
