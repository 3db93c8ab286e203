"""Euler-Maruyama on an adaptive time grid (the official GeneralAnnealing), vectorised over particles:

t_{n+1} = t_n + h_n,  h_n = a(tau_n) / L(tau_n)^2,
X_{n+1} = X_n + h_n b(X_n, tau_n) + sqrt(2 h_n) xi_n,   xi_n ~ N(0, I).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from paperflow.annealed_langevin.gmm import GMM
from paperflow.annealed_langevin.paths import schedule, step_constants
from paperflow.core.array_checkpoint import ArrayCheckpoint
from paperflow.core.resume import EVERY_S

log = logging.getLogger(__name__)


GRIDS = ("adaptive", "uniform")


def build_grid(path: str, gmm: GMM, T: float, tau0: float, t_max: float, maxit: int, grid: str) -> pd.DataFrame:
    """Times t_0 = 0 < t_1 < ... (stop once t >= t_max or the grid has maxit points) and tau_n = tau(t_n).
    ULA's grid is the constant step a_pi / L_pi^2 from 0 below t_max, as in the official script;
    grid = 'uniform' gives every path that step (the official experiment_gmm_1D_unif_step.py)."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; known: {', '.join(GRIDS)}")
    L_pi, a_pi = gmm.lipschitz, gmm.convexity
    var_min, var_max = float(gmm.stds.min() ** 2), float(gmm.stds.max() ** 2)
    if path == "ula" or grid == "uniform":
        times = np.arange(0.0, t_max, a_pi / L_pi**2)[:maxit]
        taus = np.zeros_like(times) if path == "ula" else schedule(times, T, tau0)
        return pd.DataFrame({"t": times, "tau": taus})
    times = [0.0]
    while times[-1] < t_max and len(times) < maxit:
        L, a = step_constants(path, float(schedule(times[-1], T, tau0)), L_pi, a_pi, var_min, var_max)
        times.append(times[-1] + a / L**2)
    times = np.asarray(times)
    return pd.DataFrame({"t": times, "tau": schedule(times, T, tau0)})


def snapshot_iterations(n_steps: int, every: int) -> np.ndarray:
    """0, every, 2 every, ... and always the last iterate n_steps."""
    return np.unique(np.append(np.arange(0, n_steps + 1, every), n_steps))


def run_em(
    x0: np.ndarray,
    times: np.ndarray,
    taus: np.ndarray,
    drift: Callable[[np.ndarray, float], np.ndarray],
    rng: np.random.Generator,
    snapshots: np.ndarray | None = None,
    progress: bool = False,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
) -> dict[int, np.ndarray]:
    """Iterate EM over the grid (len(times) - 1 steps); return {iteration: particles} at `snapshots`
    (default: only the last iterate). The drift at step n uses tau_n, the step is t_{n+1} - t_n. With
    `checkpoint_dir` (this chain's folder under the job's checkpoint_dir()) the chain (particles, snapshots so far,
    generator) is saved there after a step every `checkpoint_every_s` at most and at the end
    (`core.array_checkpoint.ArrayCheckpoint`: numpy only, as the rule's env), and a rerun continues from it."""
    n_steps = len(times) - 1
    keep = set(int(i) for i in (snapshots if snapshots is not None else [n_steps]))
    x = np.array(x0, dtype=np.float64)
    out = {0: x.copy()} if 0 in keep else {}
    h = np.diff(times)
    checkpoint = None if checkpoint_dir is None else ArrayCheckpoint(checkpoint_dir, checkpoint_every_s)
    start = 0
    if checkpoint is not None:
        start, arrays, meta = checkpoint.restore()
        if start:  # the chain as saved: particles, snapshots so far, generator
            x = arrays["x"]
            out.clear()
            out.update({int(k.removeprefix("it")): v for k, v in arrays.items() if k.startswith("it")})
            rng.bit_generator.state = meta["rng"]
    for n in tqdm(range(start, n_steps), disable=not progress, mininterval=5.0, desc="EM", initial=start):
        x = x + h[n] * drift(x, float(taus[n])) + np.sqrt(2.0 * h[n]) * rng.standard_normal(x.shape)
        if n + 1 in keep:
            out[n + 1] = x.copy()
        if checkpoint is not None and checkpoint.due():
            checkpoint.save(n + 1, chain_arrays(x, out), {"rng": rng.bit_generator.state})
    if checkpoint is not None and start < n_steps:  # a rerun of the job loads this chain instead of running it again
        checkpoint.save(n_steps, chain_arrays(x, out), {"rng": rng.bit_generator.state})
    return out


def chain_arrays(x: np.ndarray, snapshots: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """What an EM chain saves between steps besides its generator: the particles and the snapshots so far."""
    return {"x": x, **{f"it{k}": v for k, v in snapshots.items()}}


def snapshots_frame(snaps: dict[int, np.ndarray], times: np.ndarray, seed: int) -> pd.DataFrame:
    """Long table: one row per (iteration, particle) with seed, it, t and coordinates x0..x{d-1}."""
    frames = []
    for it, x in sorted(snaps.items()):
        frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])])
        frame.insert(0, "t", float(times[it]))
        frame.insert(0, "it", it)
        frame.insert(0, "seed", seed)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def sample_path(
    gmm: GMM,
    grid: pd.DataFrame,
    drift: Callable[[np.ndarray, float], np.ndarray],
    *,
    x0: float,
    n_particles: int,
    seeds: list[int],
    check_every: int,
    progress: bool = True,
    checkpoint_dir: str | Path | None = None,
) -> pd.DataFrame:
    """All seeds of one (target, path, horizon): particles start at the point x0 (every coordinate).
    `checkpoint_dir`: the job's checkpoint folder, where each seed's chain saves (checkpoint_dir/seed<s>) and
    resumes from."""
    times, taus = grid["t"].to_numpy(), grid["tau"].to_numpy()
    snaps_at = snapshot_iterations(len(times) - 1, check_every)
    frames = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        start = np.full((n_particles, gmm.dim), float(x0))
        folder = None if checkpoint_dir is None else Path(checkpoint_dir) / f"seed{seed}"
        snaps = run_em(start, times, taus, drift, rng, snaps_at, progress=progress, checkpoint_dir=folder)
        frames.append(snapshots_frame(snaps, times, seed))
        log.info("seed %d: %d EM steps to t = %.4g", seed, len(times) - 1, times[-1])
    return pd.concat(frames, ignore_index=True)
