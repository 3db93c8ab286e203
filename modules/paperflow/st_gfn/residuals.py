"""Per-step detailed-balance residuals of torchgfn trajectories (spec 2.2), in the layout (T, B).

    delta_t = log F(s_t) + log P_F(s_{t+1}|s_t) - log F(s_{t+1}) - log P_B(s_t|s_{t+1}),  t = 0..n-1

with the exit step included (its target is the observed log R(x) and log P_B = 0), so that the residuals
sum to torchgfn's TB residual and their squares sum to torchgfn's DB loss (spec section 9).
log F(s_0) is the TB parameter log Z when `log_z` is given, else the flow estimator at s_0 (as in DB).
Edge intrinsic rewards r_int_t enter the target as log(F(s_{t+1}) P_B + r_int_t) (spec 2.3 step 4).
"""

from __future__ import annotations

import torch
from gfn.containers import Trajectories
from gfn.estimators import Estimator, ScalarEstimator
from gfn.utils.prob_calculations import get_trajectory_pfs_and_pbs


def step_mask(trajectories: Trajectories) -> torch.Tensor:
    """(T, B) True where step t < n_b (the valid actions of trajectory b, exit included)."""
    steps = torch.arange(trajectories.max_length, device=trajectories.device)[:, None]
    return steps < trajectories.terminating_idx[None, :]


def state_log_flows(log_f: ScalarEstimator, trajectories: Trajectories) -> torch.Tensor:
    """(T, B) log F(s_t) for the non-sink states s_0..s_{n-1} of each trajectory, 0 elsewhere."""
    mask = step_mask(trajectories)
    states = trajectories.states[: trajectories.max_length]
    out = torch.zeros(mask.shape, dtype=torch.get_default_dtype(), device=trajectories.device)
    values = log_f(states[mask]).squeeze(-1)
    return out.masked_scatter(mask, values.to(out.dtype))


def residuals(
    pf: Estimator,
    pb: Estimator,
    log_f: ScalarEstimator,
    trajectories: Trajectories,
    log_rewards: torch.Tensor,
    log_z: torch.Tensor | None = None,
    intrinsic: torch.Tensor | None = None,
) -> torch.Tensor:
    """delta (T, B), zero beyond each trajectory's length."""
    mask = step_mask(trajectories)
    lengths = trajectories.terminating_idx
    log_pf, log_pb = get_trajectory_pfs_and_pbs(pf, pb, trajectories, recalculate_all_logprobs=True)
    flows = state_log_flows(log_f, trajectories)
    if log_z is not None:
        flows = torch.cat([log_z.reshape(1, 1).expand(1, flows.shape[1]).to(flows.dtype), flows[1:]], dim=0)
    # log F(s_{t+1}): the next row, with the (observed) log reward at the exit step t = n - 1
    nxt = torch.cat([flows[1:], torch.zeros_like(flows[:1])], dim=0)
    is_exit = torch.arange(flows.shape[0], device=flows.device)[:, None] == (lengths - 1)[None, :]
    nxt = torch.where(is_exit, log_rewards[None, :].to(flows.dtype).expand_as(nxt), nxt)
    target = nxt + log_pb
    if intrinsic is not None:
        target = torch.logaddexp(target, torch.log(intrinsic.to(target.dtype).clamp_min(1e-30)))
    delta = flows + log_pf - target
    return torch.where(mask, delta, torch.zeros_like(delta))
