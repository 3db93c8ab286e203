"""Environments (torchgfn's HyperGrid through its public API), observation noise and the exact target."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd
import torch
from gfn.gym import HyperGrid
from gfn.preprocessors import KHotPreprocessor, Preprocessor


def make_env(spec: Mapping[str, Any]) -> HyperGrid:
    """A torchgfn HyperGrid with all states stored (exact target by enumeration)."""
    if spec["kind"] != "hypergrid":
        raise ValueError(f"unknown env kind {spec['kind']!r}")
    rewards = {k: float(spec[k]) for k in ("R0", "R1", "R2")}
    return HyperGrid(ndim=int(spec["ndim"]), height=int(spec["height"]), reward_fn_kwargs=rewards,
                     store_all_states=True)


def max_length(env: HyperGrid) -> int:
    """Number of actions of the longest trajectory, exit included: ndim (height - 1) + 1."""
    return env.ndim * (env.height - 1) + 1


def step_index(states_tensor: torch.Tensor) -> torch.Tensor:
    """t of a HyperGrid state = sum of its coordinates (its depth in the DAG)."""
    return states_tensor.clamp_min(0).sum(-1)


def observed_log_reward(log_reward: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """log R_obs = log R + sigma * eps, eps ~ N(0, 1): unbiased in log space (spec section 4)."""
    if sigma == 0:
        return log_reward
    eps = torch.randn(log_reward.shape, generator=generator, dtype=log_reward.dtype)
    return log_reward + sigma * eps


def exact_target(env: HyperGrid) -> torch.Tensor:
    """pi = R / Z over the terminal states, in torchgfn's canonical state order."""
    return env.true_dist().to(torch.float64)


def mode_mask(env: HyperGrid) -> torch.Tensor:
    """Modes: terminal states with R(x) >= R0 + R1 + R2 (spec section 8)."""
    kw = env.reward_fn_kwargs
    threshold = kw["R0"] + kw["R1"] + kw["R2"]
    return env.reward(env.all_states) >= threshold * (1 - 1e-6)  # float32 rewards


class TimeFourierPreprocessor(Preprocessor):
    """K-hot state encoding concatenated with Fourier features of the step index (spec 2.1 [R]):
    gamma(t) = [sin(2 pi k t / T_max), cos(2 pi k t / T_max)], k = 1..K."""

    def __init__(self, height: int, ndim: int, n_frequencies: int, t_max: int) -> None:
        self.khot = KHotPreprocessor(height=height, ndim=ndim)
        super().__init__(output_dim=self.khot.output_dim + 2 * n_frequencies)
        self.freqs = torch.arange(1, n_frequencies + 1, dtype=torch.float32) * (2 * math.pi / t_max)

    def preprocess(self, states) -> torch.Tensor:
        encoded = self.khot.preprocess(states)
        t = step_index(states.tensor).to(torch.float32)[..., None]
        angles = t * self.freqs.to(t.device)
        return torch.cat([encoded, torch.sin(angles), torch.cos(angles)], dim=-1)


def make_preprocessor(env: HyperGrid, time_features: int) -> Preprocessor:
    if time_features:
        return TimeFourierPreprocessor(env.height, env.ndim, time_features, max_length(env))
    return KHotPreprocessor(height=env.height, ndim=env.ndim)


def enumerate_states(spec: Mapping[str, Any]) -> pd.DataFrame:
    """Every terminal state of the env (torchgfn's canonical order), its coordinates and reward."""
    env = make_env(spec)
    coords = env.all_states.tensor.numpy()
    frame = pd.DataFrame(coords, columns=[f"x{j}" for j in range(coords.shape[1])])
    frame.insert(0, "state", env.get_states_indices(env.all_states).numpy())
    frame["reward"] = env.reward(env.all_states).double().numpy()
    return frame
