"""WC-penalty and its baselines on an ECMO problem, batched over preference vectors (spec §2, §3).

One loop serves every method; only the weights on the UL gradients differ:
    wc      lam = softmax(a / tau) (or the hard max), a_s = r_s (f_s - f_ref_s); weights lam_s r_s
    wc_sto  the same, with a noisy gradient oracle and a step decaying like 1/sqrt(t)
    ls      weights r_s (linear scalarisation)
    mgda    weights = min-norm point of the UL gradients (preference-agnostic)
    uniform no step at all: the starting point is returned (the hyper-cleaning baseline)
and the update is z <- z - eta_t * scale * (sum_s w_s grad f_s + rho_t J_h^T h), with
rho_t = min(rho_max, rho_0 (1 + t / ramp)) and eta_t = eta_0 / (L_f + rho_t L_h).
The returned point is the best iterate by the KKT measure K, evaluated every `eval_every` steps.
The loop is the paper's own, so Lightning Fabric drives it (CONVENTIONS §6; `paperflow.core.training.make_fabric`,
float64): the device is the Fabric's, and every
evaluation is logged through its loggers (CSV always; wandb when enabled).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from lightning_fabric import Fabric
from tqdm import tqdm

from paperflow.core.loop import LoopCheckpoint
from paperflow.core.resume import EVERY_S
from paperflow.mtbl_wc.kkt import kkt_measure
from paperflow.mtbl_wc.problems import Problem, penalty_grad_autograd
from paperflow.mtbl_wc.qp import min_norm_weights

log = logging.getLogger(__name__)

METHODS = ("wc", "wc_sto", "ls", "mgda", "uniform")


def penalty_schedule(t: int, cfg: dict[str, Any]) -> float:
    """rho_t = min(rho_max, rho_0 (1 + t / ramp)) (spec §2)."""
    return min(cfg["rho_max"], cfg["rho0"] * (1.0 + t / cfg["ramp"]))


def step_size(t: int, rho: float, smooth: tuple[float, float], cfg: dict[str, Any], stochastic: bool) -> float:
    """eta_t = eta_0 / (L_f + rho_t L_h), times 1 / sqrt(1 + t / decay_steps) in the stochastic variant."""
    eta = cfg["eta0"] / (smooth[0] + rho * smooth[1])
    return eta / np.sqrt(1.0 + t / cfg["decay_steps"]) if stochastic else eta


def chebyshev_weights(
    f: torch.Tensor, prefs: torch.Tensor, f_ref: torch.Tensor, tau: float, hard: bool
) -> torch.Tensor:
    """Weights lam_s r_s on grad f_s: lam = softmax(r (f - f_ref) / tau), or the one-hot argmax."""
    a = prefs * (f - f_ref)
    lam = torch.nn.functional.one_hot(a.argmax(1), a.shape[1]).to(a) if hard else torch.softmax(a / tau, dim=1)
    return lam * prefs


def mgda_weights(grads: torch.Tensor) -> torch.Tensor:
    gram = torch.einsum("bsd,btd->bst", grads, grads).cpu().numpy()
    return torch.as_tensor(min_norm_weights(gram), dtype=grads.dtype, device=grads.device)


def ul_weights(method: str, f, grads, prefs, f_ref, cfg) -> torch.Tensor:
    if method in ("wc", "wc_sto"):
        return chebyshev_weights(f, prefs, f_ref, cfg["tau"], cfg["chebyshev"] == "hard")
    if method == "ls":
        return prefs
    if method == "mgda":
        return mgda_weights(grads)
    raise ValueError(f"method {method!r} has no UL weights; known: {', '.join(METHODS)}")


def measure(problem: Problem, z: torch.Tensor):
    """K(z) and its parts for every row of z (numpy)."""
    with torch.no_grad():
        grads = problem.objective_grads(z).cpu().numpy()
        jac = problem.jacobian(z).cpu().numpy()
        h = problem.constraint(z).cpu().numpy()
    return kkt_measure(grads, jac, h)


@dataclass
class RunResult:
    z_best: np.ndarray
    z_final: np.ndarray
    history: pd.DataFrame


class RunState:
    """What a run carries from step to step, as an object `LoopCheckpoint` saves: the iterates z and the best ones
    with their K, the noise generator (wc_sto) and the history rows so far; restored in place into the run's own
    tensors, array and list. A checkpoint is taken right after an evaluation, so every state is saved whole."""

    def __init__(self, z: torch.Tensor, z_best: torch.Tensor, best_k: np.ndarray, gen: torch.Generator, rows: list):
        self.z, self.z_best, self.best_k, self.gen, self.rows = z, z_best, best_k, gen, rows

    def state_dict(self) -> dict[str, Any]:
        return {
            "z": self.z.detach().cpu(),
            "z_best": self.z_best.detach().cpu(),
            "best_k": torch.from_numpy(self.best_k.copy()),
            "gen": self.gen.get_state(),
            "rows": [{k: float(v) if k not in ("step", "pref") else int(v) for k, v in r.items()} for r in self.rows],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.z.copy_(state["z"])
        self.z_best.copy_(state["z_best"])
        self.best_k[:] = state["best_k"].numpy()
        self.gen.set_state(state["gen"])
        self.rows[:] = state["rows"]


def run(
    problem: Problem,
    method: str,
    prefs: np.ndarray,
    z0: np.ndarray,
    f_ref: np.ndarray,
    cfg: dict[str, Any],
    seed: int,
    fabric: Fabric | None = None,
    labels: list[str] | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
) -> RunResult:
    """Run `method` from z0 (B, d) for every preference row of prefs (B, S) on the problem's device; returns
    best/final iterates and the history (K, its parts, f, ||h|| per evaluation step and row), which is also
    logged through `fabric`'s loggers (none when fabric is None) under each row's label (default pref<row>).
    f_ref is one reference point (S,) or one per row (B, S). With `checkpoint_dir` (this run's folder under the
    job's checkpoint_dir()) the run's state (`RunState`) is saved there after an evaluation step every
    `checkpoint_every_s` at most and at the end, and a rerun continues from it (a finished run is loaded)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    device = _device_of(problem)
    z = torch.as_tensor(z0, dtype=torch.float64, device=device).clone()
    prefs_t = torch.as_tensor(prefs, dtype=torch.float64, device=device)
    f_ref_t = torch.as_tensor(np.array(f_ref), dtype=torch.float64, device=device)
    scale = torch.ones(z.shape[1], dtype=torch.float64, device=device)
    scale[: problem.dim_x] = cfg["x_step"]
    smooth = problem.smoothness()
    stochastic = method == "wc_sto"
    gen = torch.Generator(device=device).manual_seed(seed)
    steps = 0 if method == "uniform" else cfg["steps"]
    best_k = np.full(len(z), np.inf)
    z_best = z.clone()
    rows = []
    names = labels if labels is not None else [f"pref{i}" for i in range(len(z))]

    def record(t: int) -> None:
        nonlocal z_best
        k = measure(problem, z)
        better = k.value < best_k
        best_k[better] = k.value[better]
        z_best[torch.as_tensor(better, device=device)] = z[torch.as_tensor(better, device=device)]
        with torch.no_grad():
            f = problem.objectives(z).cpu().numpy()
        new = [
            {
                "step": t,
                "pref": i,
                "K": k.value[i],
                "K_stat": k.stationarity[i],
                "K_feas": k.feasibility[i],
                "K_best": best_k[i],
                "h_norm": float(np.sqrt(k.feasibility[i])),
                **{f"f{s + 1}": f[i, s] for s in range(f.shape[1])},
            }
            for i in range(len(z))
        ]
        rows.extend(new)
        if fabric is not None:
            fabric.log_dict(
                {f"{names[r['pref']]}/{key}": float(r[key]) for r in new for key in r if key not in ("step", "pref")},
                step=t,
            )

    state = RunState(z, z_best, best_k, gen, rows)
    checkpoint = None if checkpoint_dir is None else LoopCheckpoint(checkpoint_dir, {"run": state}, checkpoint_every_s)
    start, _ = (0, []) if checkpoint is None else checkpoint.restore()
    if start == 0:
        record(0)
    elif fabric is not None:  # a fresh log has every evaluation
        for t, group in pd.DataFrame(rows).groupby("step", sort=True):
            fabric.log_dict(
                {f"{names[int(r.pref)]}/{key}": float(r[key]) for _, r in group.iterrows() for key in r.index
                 if key not in ("step", "pref")},
                step=int(t),
            )  # fmt: skip
    for t in tqdm(range(start, steps), desc=f"{method}", mininterval=5.0, disable=None, initial=start):
        with torch.no_grad():
            f = problem.objectives(z)
            grads = problem.objective_grads(z)
        pgrad = penalty_grad_autograd(problem, z) if cfg["penalty_grad"] == "autograd" else problem.penalty_grad(z)
        with torch.no_grad():
            if stochastic:
                grads = grads + cfg["noise_std"] * torch.randn(grads.shape, generator=gen, dtype=z.dtype, device=device)
                pgrad = pgrad + cfg["noise_std"] * torch.randn(pgrad.shape, generator=gen, dtype=z.dtype, device=device)
            w = ul_weights(method, f, grads, prefs_t, f_ref_t, cfg)
            rho = penalty_schedule(t, cfg)
            direction = torch.einsum("bs,bsd->bd", w, grads) + rho * pgrad
            z -= step_size(t, rho, smooth, cfg, stochastic) * scale * direction
        if (t + 1) % cfg["eval_every"] == 0 or t + 1 == steps:
            record(t + 1)
            if checkpoint is not None:
                checkpoint.step_done(t, [])
    if checkpoint is not None and start < steps:
        checkpoint.save(steps, [])  # a rerun of the job loads this run instead of running it again
    log.info("%s: %d steps, best K per preference %s", method, steps, np.array2string(best_k, precision=3))
    if fabric is not None:
        for logger in fabric.loggers:
            logger.finalize("success")
    return RunResult(z_best=z_best.cpu().numpy(), z_final=z.cpu().numpy(), history=pd.DataFrame(rows))


def _device_of(problem: Problem) -> torch.device:
    for value in vars(problem).values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")
