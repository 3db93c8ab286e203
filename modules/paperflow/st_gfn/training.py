"""The training loop of spec 2.4: a plain torch loop over torchgfn samplers and losses (no Lightning:
sampling-based training has no dataset/epoch structure, and Lightning's start-up would dominate
runs of a few seconds)."""

from __future__ import annotations

import logging
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from paperflow.st_gfn.envs import max_length, observed_log_reward
from paperflow.st_gfn.intrinsic import annealed_beta, anticausal_credit, autocorrelation_kernel, lorentzian_psd, novelty
from paperflow.st_gfn.models import batch_loss, make_gflownet, optimizer
from paperflow.st_gfn.residuals import step_mask
from paperflow.st_gfn.sampling import make_sampler

log = logging.getLogger(__name__)

NOISE_SEED_OFFSET = 10_000  # the reward-noise generator of seed s is seeded with s + this


def intrinsic_rewards(env, trajectories, counts: torch.Tensor, rho: torch.Tensor, scale: float) -> torch.Tensor:
    """r_int (T, B) = scale * sum_{l>=0} rho(l) nov(s_{t+1+l}) with nov from visit counts (spec 2.3);
    the exit step reaches the sink, whose novelty is 0. Updates `counts` with the visited states."""
    mask = step_mask(trajectories)
    t_max = trajectories.max_length
    states = trajectories.states[: t_max]
    idx = env.get_states_indices(states.tensor.clamp_min(0))
    nov = torch.where(mask, novelty(counts)[idx], torch.zeros(mask.shape, dtype=torch.float64))
    nov_next = torch.cat([nov[1:], torch.zeros_like(nov[:1])], dim=0)
    lengths = trajectories.terminating_idx
    credit = anticausal_credit(nov_next, lengths, rho)
    counts.index_put_((idx[mask],), torch.ones_like(idx[mask], dtype=counts.dtype), accumulate=True)
    return scale * credit


def train_one(env, env_spec: Mapping[str, Any], method: Mapping[str, Any], model: Mapping[str, Any],
              train: Mapping[str, Any], seed: int, progress: bool = True):
    """Train one method on `env` (built from `env_spec`) with one seed.
    Returns (state_dict, history, visited terminal indices)."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    noise = torch.Generator().manual_seed(seed + NOISE_SEED_OFFSET)
    gfn = make_gflownet(env, method, model)
    opt = optimizer(gfn, train["lr"], train["lr_logz"])
    sampler = make_sampler(env, gfn.pf)
    use_intrinsic = method["kind"] == "st_gfn" and method.get("intrinsic", False)
    counts = torch.zeros(env.n_states, dtype=torch.float64)
    rho = autocorrelation_kernel(lorentzian_psd(max_length(env), float(method.get("omega_r", 0.1))))
    n_it, batch = int(train["iterations"]), int(train["batch_size"])
    losses, visited, betas = np.empty(n_it), np.empty((n_it, batch), dtype=np.int64), np.zeros(n_it)
    for it in tqdm(range(n_it), desc=f"{method['kind']} seed {seed}", disable=not progress, mininterval=5):
        with torch.no_grad():
            trajectories = sampler.sample_trajectories(env, n=batch, epsilon=float(train["epsilon"]))
        log_r = observed_log_reward(trajectories.log_rewards, float(env_spec["sigma"]), noise)
        intrinsic = None
        if use_intrinsic:
            betas[it] = annealed_beta(float(method["beta0"]), it, n_it, float(method["anneal_fraction"]))
            scale = betas[it] * float(torch.exp(log_r).mean())
            r_int = intrinsic_rewards(env, trajectories, counts, rho, scale)
            intrinsic = r_int if betas[it] > 0 else None
        loss = batch_loss(gfn, env, trajectories, log_r, intrinsic)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gfn.parameters(), float(train["grad_clip"]))
        opt.step()
        losses[it] = float(loss.detach())
        visited[it] = env.get_states_indices(trajectories.terminating_states).numpy()
    history = pd.DataFrame({"iteration": np.arange(n_it), "seed": seed, "loss": losses, "beta": betas})
    visits = pd.DataFrame({"iteration": np.repeat(np.arange(n_it), batch), "seed": seed,
                           "state": visited.reshape(-1)})
    return gfn.state_dict(), history, visits
