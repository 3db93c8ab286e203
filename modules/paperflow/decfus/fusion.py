"""What happens between rounds: every method is a per-tensor mixing matrix M^ℓ (m × m) applied to
the stacked post-local snapshot, w_i^ℓ ← Σ_j M^ℓ_ij w_j^ℓ (spec §2.2 step 3, §3).

States are dicts `name -> tensor of shape (m, *shape)` (one row per client). Every rule reads the
same pre-fusion snapshot; no client sees another's fused tensor within a round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from paperflow.decfus.topology import (
    Neighbours,
    closed_neighbourhood,
    global_mixing,
    sample_weighted_mixing,
    uniform_mixing,
)

States = dict[str, torch.Tensor]
FUSION_METHODS = ("decfus", "decfus_fixed", "dflavg", "dflmr", "fedavg", "dpsgd")


def fused_keys(states: Mapping[str, torch.Tensor]) -> list[str]:
    """State tensors that take part in fusion: floating point ones (BN `num_batches_tracked` stays own)."""
    return [k for k, v in states.items() if v.is_floating_point() and "num_batches_tracked" not in k]


def cosine_matrix(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Pairwise cosine similarity of the rows of x (m × d), as F.cosine_similarity on flattened tensors."""
    x = x.double()
    norms = x.norm(dim=1).clamp_min(eps)
    return (x @ x.T) / (norms[:, None] * norms[None, :])


def least_similar_neighbours(
    states: Mapping[str, torch.Tensor], keys: Sequence[str], neighbours: Neighbours
) -> tuple[np.ndarray, np.ndarray]:
    """s_min[i, ℓ] = min_{j∈N(i)} cos(w_i^ℓ, w_j^ℓ) and the argmin j*[i, ℓ] (first in N(i) on ties)."""
    m = len(neighbours)
    s_min = np.zeros((m, len(keys)))
    j_star = np.zeros((m, len(keys)), dtype=int)
    for l, key in enumerate(keys):
        cos = cosine_matrix(states[key].reshape(m, -1)).cpu().numpy()
        for i, nb in enumerate(neighbours):
            sims = cos[i, nb]
            pos = int(np.argmin(sims))
            s_min[i, l], j_star[i, l] = sims[pos], nb[pos]
    return s_min, j_star


@dataclass(frozen=True)
class Fusion:
    """The mixing matrices of one round (keys × m × m) and, for DecFus, which tensors were averaged."""

    keys: list[str]
    mixing: np.ndarray
    averaged: np.ndarray  # (m, keys) bool: True where client i averaged tensor ℓ

    def apply(self, states: States) -> States:
        out = dict(states)
        for l, key in enumerate(self.keys):
            w = torch.as_tensor(self.mixing[l], dtype=states[key].dtype, device=states[key].device)
            out[key] = torch.einsum("ij,j...->i...", w, states[key])
        return out


def decfus_fusion(
    states: States,
    neighbours: Neighbours,
    n: Sequence[int],
    thetas: Sequence[float],
    p_exchange: float,
    rng: np.random.Generator,
) -> Fusion:
    """Layer-wise fusion: per client i, tensors whose least-neighbour similarity is above the
    100·θ_i-th percentile of the client's own s_min values are averaged over {i} ∪ N(i) with weights
    n_j (exploitation); the others are exchanged (exploration): with probability p_exchange from the
    least similar neighbour j*, else from a uniform draw in {i} ∪ N(i) \\ {j*}."""
    keys = fused_keys(states)
    m = len(neighbours)
    s_min, j_star = least_similar_neighbours(states, keys, neighbours)
    avg_rows = sample_weighted_mixing(neighbours, n)
    mixing = np.zeros((len(keys), m, m))
    averaged = np.zeros((m, len(keys)), dtype=bool)
    for i in range(m):
        cutoff = np.percentile(s_min[i], 100.0 * thetas[i])
        for l in range(len(keys)):
            if s_min[i, l] > cutoff:
                mixing[l, i] = avg_rows[i]
                averaged[i, l] = True
                continue
            if rng.random() < p_exchange:
                source = j_star[i, l]
            else:
                choices = [j for j in closed_neighbourhood(neighbours, i) if j != j_star[i, l]]
                source = choices[rng.integers(len(choices))]
            mixing[l, i, source] = 1.0
    return Fusion(keys, mixing, averaged)


def constant_fusion(states: States, w: np.ndarray) -> Fusion:
    """The same mixing matrix for every tensor (DFLAvg, FedAvg, D-PSGD's gossip)."""
    keys = fused_keys(states)
    return Fusion(keys, np.repeat(w[None], len(keys), axis=0), np.ones((w.shape[0], len(keys)), dtype=bool))


def dflmr_fusion(states: States, neighbours: Neighbours, rng: np.random.Generator) -> Fusion:
    """Decentralised FedMR: every tensor of client i is copied from a uniform draw in {i} ∪ N(i)."""
    keys = fused_keys(states)
    m = len(neighbours)
    mixing = np.zeros((len(keys), m, m))
    for i in range(m):
        nb = closed_neighbourhood(neighbours, i)
        for l in range(len(keys)):
            mixing[l, i, nb[rng.integers(len(nb))]] = 1.0
    return Fusion(keys, mixing, np.zeros((m, len(keys)), dtype=bool))


def round_fusion(
    method: str,
    states: States,
    neighbours: Neighbours,
    n: Sequence[int],
    thetas: Sequence[float],
    p_exchange: float,
    rng: np.random.Generator,
) -> Fusion | None:
    """The end-of-round fusion of `method`; None for D-PSGD, which gossips after every local step. DecFus's
    ablation `decfus_fixed` fuses as DecFus; its θ stays at θ0 because the simulation runs no phase control for it."""
    if method in ("decfus", "decfus_fixed"):
        return decfus_fusion(states, neighbours, n, thetas, p_exchange, rng)
    if method == "dflavg":
        return constant_fusion(states, uniform_mixing(neighbours))
    if method == "dflmr":
        return dflmr_fusion(states, neighbours, rng)
    if method == "fedavg":
        return constant_fusion(states, global_mixing(n))
    if method == "dpsgd":
        return None
    raise ValueError(f"unknown method {method!r}; known: {', '.join(FUSION_METHODS)}")


def consensus_distance(states: Mapping[str, torch.Tensor]) -> float:
    """(1/m) Σ_i ‖w_i − w̄‖² over the fused tensors (spec §8)."""
    total = 0.0
    for key in fused_keys(states):
        x = states[key].double()
        total += float(((x - x.mean(dim=0, keepdim=True)) ** 2).sum())
    return total / next(iter(states.values())).shape[0]
