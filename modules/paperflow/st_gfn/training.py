"""The training loop of spec 2.4. `TrainingRun` is one iteration's work (sample, observe the noisy reward,
intrinsic reward, loss) and the records; two engines drive it with the same random streams:

- `train_one`, the plain torch loop `paperflow.core.loop.run_loop` (tiny and smoke scale: runs of seconds,
  where Lightning's start-up and per-step hooks would dominate);
- `paperflow.st_gfn.lightning` (paper scale, `train.engine: lightning`): a LightningModule whose training
  step is `TrainingRun.loss`, on whatever device the job was given.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.loop import GeneratorState, run_loop
from paperflow.core.seeding import seed_all
from paperflow.st_gfn.envs import max_length, n_state_keys, observed_log_reward, state_keys, terminal_record
from paperflow.st_gfn.intrinsic import annealed_beta, anticausal_credit, autocorrelation_kernel, lorentzian_psd, novelty
from paperflow.st_gfn.models import batch_loss, make_gflownet, optimizer
from paperflow.st_gfn.residuals import step_mask
from paperflow.st_gfn.sampling import make_sampler
from paperflow.st_gfn.settings import known_keys

log = logging.getLogger(__name__)

NOISE_SEED_OFFSET = 10_000  # the reward-noise generator of seed s is seeded with s + this


def intrinsic_rewards(env, trajectories, counts: torch.Tensor, rho: torch.Tensor, scale: float) -> torch.Tensor:
    """r_int (T, B) = scale * sum_{l>=0} rho(l) nov(s_{t+1+l}) with nov from visit counts (spec 2.3);
    the exit step reaches the sink, whose novelty is 0. Updates `counts` with the visited states."""
    mask = step_mask(trajectories)
    states = trajectories.states[: trajectories.max_length]
    idx = state_keys(env, states.tensor)
    nov = torch.where(mask, novelty(counts)[idx], torch.zeros(mask.shape, dtype=torch.float64, device=mask.device))
    nov_next = torch.cat([nov[1:], torch.zeros_like(nov[:1])], dim=0)
    credit = anticausal_credit(nov_next, trajectories.terminating_idx, rho)
    counts.index_put_((idx[mask],), torch.ones_like(idx[mask], dtype=counts.dtype), accumulate=True)
    return scale * credit


class RunRecords:
    """The records every kind of run keeps (`TrainingRun` here, `game_training.GameRun`): the loss of each
    iteration in `losses` and, per iteration, a dict of arrays over the batch in `visited`. Each kind of
    run defines `loss(it)`, iteration `it`'s work and loss, which `fit` and the Lightning module drive."""

    losses: np.ndarray
    visited: list[dict[str, np.ndarray]]
    batch: int
    seed: int
    n_iterations: int

    def record_loss(self, it: int, loss: torch.Tensor) -> None:
        self.losses[it] = float(loss.detach())

    def fit(
        self, net: torch.nn.Module, opt: torch.optim.Optimizer, grad_clip: float, desc: str, progress: bool | None
    ) -> None:
        """The plain-loop engine: one `self.loss(it)` step per iteration, the gradients of `net` clipped to
        norm `grad_clip`, the losses recorded (Lightning drives the same runs at paper scale)."""
        records = run_loop(
            self.loss,
            opt,
            self.n_iterations,
            grad_clip=grad_clip,
            clip_parameters=net.parameters(),
            desc=desc,
            progress=progress,
        )
        self.losses[:] = [r["loss"] for r in records]

    def state_dict(self) -> dict[str, Any]:
        """What the run keeps between iterations besides the network and its optimizer, for a checkpoint taken
        mid-fit (the Lightning engine): the records so far and the reward-noise generator. Tensors only (the
        visited records stacked per column), so a checkpoint holding it loads with torch's `weights_only`."""
        visited = (
            {k: torch.from_numpy(np.stack([v[k] for v in self.visited])) for k in self.visited[0]}
            if self.visited
            else {}
        )
        return {
            "losses": torch.from_numpy(self.losses.copy()),
            "visited": visited,
            "n_visited": len(self.visited),
            "noise": GeneratorState(self.noise).state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Set the run as `state_dict` took it: a resumed fit goes on drawing and recording from there."""
        self.losses[:] = state["losses"].numpy()
        columns = {k: v.numpy() for k, v in state["visited"].items()}
        self.visited = [{k: c[i] for k, c in columns.items()} for i in range(int(state["n_visited"]))]
        GeneratorState(self.noise).load_state_dict(state["noise"])

    def visits(self) -> pd.DataFrame:
        columns = {k: np.concatenate([v[k] for v in self.visited]) for k in self.visited[0]}
        frame = pd.DataFrame({"iteration": np.repeat(np.arange(len(self.visited)), self.batch), "seed": self.seed})
        return pd.concat([frame, pd.DataFrame(columns)], axis=1)


class TrainingRun(RunRecords):
    """One run's per-iteration work and records. Build it right after the GFlowNet (the torch seed set
    before both), so that the plain loop and the Lightning module draw the same numbers."""

    def __init__(
        self,
        env,
        env_spec: Mapping[str, Any],
        method: Mapping[str, Any],
        gflownet: torch.nn.Module,
        train: Mapping[str, Any],
        seed: int,
    ) -> None:
        self.env, self.gflownet, self.seed = env, gflownet, seed
        self.sigma, self.epsilon = float(env_spec["sigma"]), float(train["epsilon"])
        self.batch, self.n_iterations = int(train["batch_size"]), int(train["iterations"])
        self.method = method
        self.noise = torch.Generator().manual_seed(seed + NOISE_SEED_OFFSET)
        self.sampler = make_sampler(env, gflownet.pf)
        self.use_intrinsic = method["kind"] == "st_gfn" and bool(method["intrinsic"])
        device = next(gflownet.parameters()).device
        self.counts = torch.zeros(n_state_keys(env), dtype=torch.float64, device=device) if self.use_intrinsic else None
        self.rho = (
            autocorrelation_kernel(lorentzian_psd(max_length(env), float(method["omega_r"]))).to(device)
            if self.use_intrinsic
            else None
        )
        self.losses, self.betas = np.full(self.n_iterations, np.nan), np.zeros(self.n_iterations)
        self.visited: list[dict[str, np.ndarray]] = []

    def loss(self, it: int) -> torch.Tensor:
        """Sample a batch with P_F (epsilon-greedy), observe the noisy log reward, add the annealed intrinsic
        reward (st_gfn), return the method's loss; records the visited terminal states."""
        with torch.no_grad():
            trajectories = self.sampler.sample_trajectories(self.env, n=self.batch, epsilon=self.epsilon)
        log_r = observed_log_reward(trajectories.log_rewards, self.sigma, self.noise)
        intrinsic = None
        if self.use_intrinsic:
            self.betas[it] = annealed_beta(
                float(self.method["beta0"]), it, self.n_iterations, float(self.method["anneal_fraction"])
            )
            scale = self.betas[it] * float(torch.exp(log_r).mean())
            r_int = intrinsic_rewards(self.env, trajectories, self.counts, self.rho, scale)
            intrinsic = r_int if self.betas[it] > 0 else None
        self.visited.append(terminal_record(self.env, trajectories.terminating_states))
        return batch_loss(self.gflownet, self.env, trajectories, log_r, intrinsic)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["betas"] = torch.from_numpy(self.betas.copy())
        if self.counts is not None:
            state["counts"] = self.counts.clone()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.betas[:] = state["betas"].numpy()
        if self.counts is not None:
            self.counts.copy_(state["counts"])

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(
            {"iteration": np.arange(self.n_iterations), "seed": self.seed, "loss": self.losses, "beta": self.betas}
        )


def train_one(
    env,
    env_spec: Mapping[str, Any],
    method: Mapping[str, Any],
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    seed: int,
    progress: bool | None = None,
):
    """Train one method on `env` (built from `env_spec`) with one seed, in a plain torch loop (progress bar
    on a terminal unless `progress` says). Returns (state_dict, history, visited terminal states)."""
    known_keys("model", model)
    known_keys("train", train)
    seed_all(seed)
    gfn = make_gflownet(env, method, model)
    opt = optimizer(gfn, train["lr"], train["lr_logz"])
    run = TrainingRun(env, env_spec, method, gfn, train, seed)
    run.fit(gfn, opt, float(train["grad_clip"]), f"{method['kind']} seed {seed}", progress)
    return gfn.state_dict(), run.history(), run.visits()
