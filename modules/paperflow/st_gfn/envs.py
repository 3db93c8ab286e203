"""Environments, all torchgfn's through its public API, one place to build them (`make_env`):

- `hypergrid`: torchgfn's `HyperGrid` (the spec's smoke envs and the paper-scale 20^4 grid), exact target
  by enumeration;
- `bitseq`: torchgfn's `BitSequence` (noisy sequence generation, `paperflow.st_gfn.sequences`);
- `geneset`: torchgfn's `SetAddition` with the single-cell perturbation proxy (`paperflow.st_gfn.perturbation`),
  exact target by enumeration of the gene sets;
- `tictactoe`, `connect4`: two-player games on the project's own engines (`paperflow.st_gfn.games`).

Every env observes its reward through the log-space noise of spec section 4 (`observed_log_reward`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
from gfn.gym import BitSequence, HyperGrid, SetAddition
from gfn.preprocessors import KHotPreprocessor, Preprocessor

from paperflow.st_gfn import sequences
from paperflow.st_gfn.games import GAME_KINDS, make_game
from paperflow.st_gfn.sequences import fourier_features, time_frequencies

KINDS = ("hypergrid", "bitseq", "geneset") + GAME_KINDS
HASHED_KEYS = 1 << 20  # visit-count table size where states are not enumerated (bitseq)


class SerialHyperGrid(HyperGrid):
    """torchgfn's HyperGrid with its states enumerated in this process. torchgfn cuts the Cartesian product into
    batches and maps them over a forked `multiprocessing.Pool()`, which hung (a pool worker blocked on the queue lock
    at termination) in a process that already ran torch and wandb threads; the grids here have at most 20^4 states,
    which one process enumerates in the same order (the product, batch after batch) in well under a second."""

    def _generate_combinations_in_batches(self, ndim: int, max_val: int, batch_size: int):
        product = itertools.product(range(max_val + 1), repeat=ndim)
        for _ in range(0, (max_val + 1) ** ndim, batch_size):
            yield list(itertools.islice(product, batch_size))


def make_env(spec: Mapping[str, Any], target: pd.DataFrame | None = None, device: str | torch.device = "cpu"):
    """The torchgfn environment of `spec`; `geneset` needs its preprocessed target (the proxy's rewards)."""
    kind = spec["kind"]
    if kind == "hypergrid":
        rewards = {k: float(spec[k]) for k in ("R0", "R1", "R2")}
        return SerialHyperGrid(
            ndim=int(spec["ndim"]),
            height=int(spec["height"]),
            reward_fn_kwargs=rewards,
            store_all_states=True,
            device=device,
        )
    if kind == "bitseq":
        return sequences.make_bitseq(spec, device)
    if kind in GAME_KINDS:  # the project's own engines (paperflow.st_gfn.games), not a torchgfn env
        return make_game(spec)
    if kind == "geneset":
        if target is None:
            raise ValueError("a geneset env is built from its preprocessed target (the proxy's rewards)")
        return make_geneset(spec, target, device)
    raise ValueError(f"unknown env kind {kind!r}; known: {', '.join(KINDS)}")


class SetLogReward:
    """torchgfn `SetAddition` reward: exp(log R) of each k-item 0/1 vector, looked up by its colex rank
    (`perturbation.colex_rank`: sum_i C(c_i, i) over the sorted items c_1 < ... < c_k)."""

    def __init__(self, log_reward: torch.Tensor, n_items: int, k: int) -> None:
        self.log_reward, self.k = log_reward, k
        self.binom = torch.tensor([[math.comb(n, i) for i in range(k + 1)] for n in range(n_items)], dtype=torch.long)

    def rank(self, tensor: torch.Tensor) -> torch.Tensor:
        present = tensor > 0
        if not bool((present.sum(-1) == self.k).all()):
            raise ValueError(f"gene-set reward asked for a set without exactly {self.k} items")
        items = present.nonzero()[:, 1].reshape(-1, self.k)  # row-major: increasing items per row
        slots = torch.arange(1, self.k + 1, device=items.device)
        return self.binom.to(items.device)[items, slots].sum(-1)

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.log_reward.to(tensor.device)[self.rank(tensor)]).to(torch.get_default_dtype())


def make_geneset(spec: Mapping[str, Any], target: pd.DataFrame, device: str | torch.device = "cpu") -> SetAddition:
    """torchgfn's SetAddition over the target's genes, fixed length k, with the proxy's rewards."""
    k = int(spec["k"])
    n_items = 1 + max(int(i) for items in target["items"] for i in items.split())  # every gene is in some set
    if len(target) != math.comb(n_items, k) or not np.array_equal(target["state"], np.arange(len(target))):
        raise ValueError(f"the target lists {len(target)} sets, not the C({n_items}, {k}) sets in colex order")
    log_reward = torch.as_tensor(target["log_reward"].to_numpy(), dtype=torch.float64)
    return SetAddition(
        n_items=n_items, max_items=k, reward_fn=SetLogReward(log_reward, n_items, k), fixed_length=True, device=device
    )


def max_length(env) -> int:
    """Number of actions of the longest trajectory, exit included."""
    if isinstance(env, HyperGrid):
        return env.ndim * (env.height - 1) + 1
    if isinstance(env, BitSequence):
        return env.words_per_seq + 1
    if isinstance(env, SetAddition):
        return env.max_traj_len + 1
    raise TypeError(f"no trajectory length for {type(env).__name__}")


def step_index(states) -> torch.Tensor:
    """t of a state = its depth in the DAG: HyperGrid the sum of its coordinates, BitSequence the words
    written, SetAddition the items chosen (the sink counts as 0 where its tensor is negative)."""
    if hasattr(states, "length"):
        return states.length
    return states.tensor.clamp_min(0).sum(-1)


def observed_log_reward(log_reward: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """log R_obs = log R + sigma * eps, eps ~ N(0, 1): unbiased in log space (spec section 4). The noise is
    drawn on the CPU generator, so a run draws the same noise on any device."""
    if sigma == 0:
        return log_reward
    eps = torch.randn(log_reward.shape, generator=generator, dtype=log_reward.dtype)
    return log_reward + sigma * eps.to(log_reward.device)


def exact_target(env: HyperGrid) -> torch.Tensor:
    """pi = R / Z over the terminal states, in torchgfn's canonical state order."""
    return env.true_dist().to(torch.float64)


def mode_mask(env: HyperGrid) -> torch.Tensor:
    """Modes: terminal states with R(x) >= R0 + R1 + R2 (spec section 8)."""
    kw = env.reward_fn_kwargs
    threshold = kw["R0"] + kw["R1"] + kw["R2"]
    return env.reward(env.all_states) >= threshold * (1 - 1e-6)  # float32 rewards


class TimeFourierPreprocessor(Preprocessor):
    """A base encoding concatenated with Fourier features of the step index (spec 2.1 [R]):
    gamma(t) = [sin(2 pi k t / T_max), cos(2 pi k t / T_max)], k = 1..K."""

    def __init__(self, base: Preprocessor, n_frequencies: int, t_max: int) -> None:
        self.base = base
        super().__init__(output_dim=base.output_dim + 2 * n_frequencies)
        self.freqs = time_frequencies(n_frequencies, t_max)

    def preprocess(self, states) -> torch.Tensor:
        return torch.cat([self.base.preprocess(states), fourier_features(step_index(states), self.freqs)], dim=-1)


class SetPreprocessor(Preprocessor):
    """SetAddition states as their 0/1 item vector (the sink's -inf entries as 0)."""

    def __init__(self, n_items: int) -> None:
        super().__init__(output_dim=n_items)

    def preprocess(self, states) -> torch.Tensor:
        return states.tensor.clamp_min(0).to(torch.float32)


def make_preprocessor(env, time_features: int) -> Preprocessor:
    if isinstance(env, BitSequence):
        return sequences.WordOneHotPreprocessor(env.words_per_seq, env.word_size, time_features)
    if isinstance(env, HyperGrid):
        base = KHotPreprocessor(height=env.height, ndim=env.ndim)
    elif isinstance(env, SetAddition):
        base = SetPreprocessor(env.n_items)
    else:
        raise TypeError(f"no preprocessor for {type(env).__name__}")
    return TimeFourierPreprocessor(base, time_features, max_length(env)) if time_features else base


def terminal_record(env, states) -> dict[str, np.ndarray]:
    """Columns that identify visited terminal states: `state` (the index of the exact target) on enumerable
    envs, the words w0..w{n-1} on BitSequence."""
    if isinstance(env, BitSequence):
        words = states.tensor.cpu().numpy()
        return {f"w{j}": words[:, j] for j in range(words.shape[1])}
    if isinstance(env, HyperGrid):
        return {"state": env.get_states_indices(states).cpu().numpy()}
    if isinstance(env, SetAddition):
        return {"state": env.reward_fn.rank(states.tensor).cpu().numpy()}
    raise TypeError(f"no terminal record for {type(env).__name__}")


def n_state_keys(env) -> int:
    """Size of the visit-count table of the intrinsic reward."""
    return env.n_states if isinstance(env, HyperGrid) else HASHED_KEYS


def state_keys(env, states_tensor: torch.Tensor) -> torch.Tensor:
    """Visit-count keys of states (..., state_dim): HyperGrid's exact state index; elsewhere a fixed
    multiplicative hash of the state vector into HASHED_KEYS buckets (count-based exploration with hashing;
    collisions share a count)."""
    if isinstance(env, HyperGrid):
        return env.get_states_indices(states_tensor.clamp_min(0))
    values = torch.nan_to_num(states_tensor.to(torch.float64), neginf=-1.0).round().to(torch.int64) + 2
    weights = torch.as_tensor(_hash_weights(values.shape[-1]), device=values.device)
    return (values * weights).sum(-1).remainder(HASHED_KEYS)


def _hash_weights(n: int) -> np.ndarray:
    """Fixed odd 31-bit multipliers, one per state coordinate (the same in every run)."""
    return np.random.default_rng(20_240_601).integers(1, 2**31, n) | 1


def enumerate_states(spec: Mapping[str, Any]) -> pd.DataFrame:
    """Every terminal state of a HyperGrid (torchgfn's canonical order), its coordinates and reward."""
    env = make_env(spec)
    coords = env.all_states.tensor.numpy()
    frame = pd.DataFrame(coords, columns=[f"x{j}" for j in range(coords.shape[1])])
    frame.insert(0, "state", env.get_states_indices(env.all_states).numpy())
    frame["reward"] = env.reward(env.all_states).double().numpy()
    return frame
