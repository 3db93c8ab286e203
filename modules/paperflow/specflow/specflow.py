"""SpecFlow (spec section 2): kNN graph (Eq. 5), restart diffusion of the [CLS] energy (Alg. 1, Eq. 2/6), adaptive
quadtree (Alg. 2, Eq. 7-8), energy-proportional quotas (Eq. 9-14) and coreset sinks (Eq. 15-16).

Arrays are numpy; a leading batch axis B where named. Token order is row-major over the H x W grid; [CLS] is not
among the N tokens (its attention row is the seed `s`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

EPS = 1e-12


@dataclass(frozen=True)
class SpecFlowConfig:
    k: int = 6  # kNN size (reconstructed)
    tau: float = 10.0  # softmax temperature on cosine (reconstructed)
    alpha: float = 0.5  # restart weight; 0 = no diffusion (ablation)
    steps: int = 2  # T_diff
    m: int = 2  # minimum crop side
    delta: float | None = None  # sigma threshold; None = 1 / N
    symmetric: bool = False  # symmetrise the kNN edge set (Prop. 3.1's setting)
    allocation: str = "quadtree"  # quadtree | topk (global Top-K ablation) | uniform (fixed crops of side m)
    sinks: bool = True  # append u_mean, u_res
    matched: bool = False  # budget-matched: K - 2 selected + 2 sinks
    graph: str = "knn"  # knn (feature graph, Eq. 5) | attn (the seed layer's token self-attention, ablation)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SpecFlowConfig:
        return cls(**dict(cfg))


def knn_graph(z: np.ndarray, k: int, tau: float, symmetric: bool = False) -> np.ndarray:
    """Eq. 5: (B, N, N) row-stochastic W; W_ij = softmax over i's k cosine neighbours (self excluded) of
    tau * cos(z_i, z_j). With `symmetric`, the edge set is symmetrised (i~j if either lists the other)."""
    zn = z / (np.linalg.norm(z, axis=-1, keepdims=True) + EPS)
    cos = zn @ np.swapaxes(zn, -1, -2)
    n = cos.shape[-1]
    k = min(k, n - 1)
    masked = np.where(np.eye(n, dtype=bool), -np.inf, cos)
    nbr = np.argsort(-masked, axis=-1, kind="stable")[..., :k]
    edges = np.zeros(cos.shape, dtype=bool)
    np.put_along_axis(edges, nbr, True, axis=-1)
    if symmetric:
        edges = edges | np.swapaxes(edges, -1, -2)
    logits = np.where(edges, tau * cos, -np.inf)
    logits = logits - logits.max(axis=-1, keepdims=True)
    w = np.exp(logits)
    return w / w.sum(axis=-1, keepdims=True)


def attention_graph(attn: np.ndarray) -> np.ndarray:
    """The raw-token-attention ablation's W: the seed layer's patch-to-patch attention (heads averaged),
    renormalised row-stochastic. `attn` (B, N, N)."""
    return attn / (attn.sum(axis=-1, keepdims=True) + EPS)


def seed_energy(cls_attn: np.ndarray) -> np.ndarray:
    """s of Alg. 1: (B, N) [CLS]->patch attention (heads already averaged), normalised to sum 1."""
    return cls_attn / (cls_attn.sum(axis=-1, keepdims=True) + EPS)


def heat_flow(s: np.ndarray, w: np.ndarray, alpha: float, steps: int, renormalise: bool = True) -> np.ndarray:
    """Eq. 2 / Alg. 1: e <- (1 - alpha) s + alpha W^T e, `steps` times from e = s (mass moves i -> i's
    neighbours). The renormalisation is for numerical stability only (mass is preserved exactly)."""
    e = s.copy()
    wt = np.swapaxes(w, -1, -2)
    for _ in range(steps):
        e = (1 - alpha) * s + alpha * np.einsum("...ij,...j->...i", wt, e)
        if renormalise:
            e = e / (e.sum(axis=-1, keepdims=True) + EPS)
    return e


def heat_fixed_point(s: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """e* solving (I - alpha W^T) e* = (1 - alpha) s (one graph, N-vectors)."""
    n = len(s)
    return np.linalg.solve(np.eye(n) - alpha * w.T, (1 - alpha) * s)


def quadtree_leaves(energy: np.ndarray, m: int, delta: float) -> list[tuple[int, int, int, int]]:
    """Alg. 2: leaves (r0, r1, c0, c1) of the adaptive quadtree over an H x W energy map. A crop splits into 4 at
    the floor midpoints iff its height and width are >= 2m and the population std of its energy exceeds delta."""
    h, w = energy.shape
    leaves, stack = [], [(0, h, 0, w)]
    while stack:
        r0, r1, c0, c1 = stack.pop()
        if r1 - r0 >= 2 * m and c1 - c0 >= 2 * m and energy[r0:r1, c0:c1].std() > delta:
            rm, cm = (r0 + r1) // 2, (c0 + c1) // 2
            stack.extend([(rm, r1, cm, c1), (rm, r1, c0, cm), (r0, rm, cm, c1), (r0, rm, c0, cm)])
        else:
            leaves.append((r0, r1, c0, c1))
    return sorted(leaves)


def uniform_leaves(h: int, w: int, m: int) -> list[tuple[int, int, int, int]]:
    """The uniform-crops ablation: fixed m x m crops (the last row/column of crops takes the remainder)."""
    rows = list(range(0, h, m))
    cols = list(range(0, w, m))
    return [(r, min(r + m, h), c, min(c + m, w)) for r in rows for c in cols]


def quotas(mass: np.ndarray, size: np.ndarray, budget: int) -> np.ndarray:
    """Eq. 9-14: q_c = min(|c|, floor(K M_c / sum M)); the remainder goes one unit per pass over the crops with
    room, in descending M (ties by index), until sum q = K. Needs 0 <= K <= sum |c|."""
    size = np.asarray(size, dtype=int)
    if not 0 <= budget <= size.sum():
        raise ValueError(f"budget {budget} outside [0, {size.sum()}]")
    total = mass.sum()
    share = budget * mass / total if total > 0 else np.full(len(mass), budget / len(mass))
    q = np.minimum(size, np.floor(share + 1e-12).astype(int))
    order = np.lexsort((np.arange(len(mass)), -mass))
    while q.sum() < budget:
        for c in order:
            if q.sum() == budget:
                break
            if q[c] < size[c]:
                q[c] += 1
    return q


def top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries' indices, ties broken by lower index (deterministic), returned in index order."""
    order = np.lexsort((np.arange(len(values)), -values))
    return np.sort(order[:k])


def allocate(energy: np.ndarray, grid: tuple[int, int], budget: int, cfg: SpecFlowConfig) -> np.ndarray:
    """Steps 3-4: the kept set S (|S| = budget, original order) of one image's energy (N,)."""
    h, w = grid
    if cfg.allocation == "topk":
        return top_indices(energy, budget)
    emap = energy.reshape(h, w)
    delta = 1.0 / energy.size if cfg.delta is None else cfg.delta
    leaves = quadtree_leaves(emap, cfg.m, delta) if cfg.allocation == "quadtree" else uniform_leaves(h, w, cfg.m)
    idx = np.arange(h * w).reshape(h, w)
    members = [idx[r0:r1, c0:c1].ravel() for r0, r1, c0, c1 in leaves]
    q = quotas(np.array([energy[mm].sum() for mm in members]), np.array([len(mm) for mm in members]), budget)
    kept = [mm[top_indices(energy[mm], qc)] for mm, qc in zip(members, q) if qc > 0]
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, dtype=int)


def coreset_sinks(z: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Eq. 15-16: (2, d) [u_mean; u_res] over the pruned rows of z (N, d); (0, d) when nothing is pruned."""
    pruned = np.setdiff1d(np.arange(len(z)), kept)
    if len(pruned) == 0:
        return np.zeros((0, z.shape[1]), dtype=z.dtype)
    u_mean = z[pruned].mean(axis=0)
    u_res = z[pruned[np.argmax(np.linalg.norm(z[pruned] - u_mean, axis=1))]]
    return np.stack([u_mean, u_res])


def energy(z: np.ndarray, cls_attn: np.ndarray, cfg: SpecFlowConfig, attn: np.ndarray | None = None) -> np.ndarray:
    """E of Alg. 1 for a batch: (B, N) from tokens z (B, N, d) and [CLS] attention (B, N)."""
    s = seed_energy(cls_attn)
    if cfg.alpha == 0:
        return s
    if cfg.graph == "attn":
        if attn is None:
            raise ValueError("graph='attn' needs the seed layer's token attention")
        w = attention_graph(attn)
    else:
        w = knn_graph(z, cfg.k, cfg.tau, cfg.symmetric)
    return heat_flow(s, w, cfg.alpha, cfg.steps)


def specflow(
    z: np.ndarray,
    cls_attn: np.ndarray,
    grid: tuple[int, int],
    budget: int,
    cfg: SpecFlowConfig,
    attn: np.ndarray | None = None,
    e: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The condensed tokens of a batch: (B, K_fed, d) with K_fed = K + 2 (sinks on), K (off) or K (matched:
    K - 2 selected + 2 sinks), and the selected indices (B, K_selected). `e`: the energy E of these tokens under
    this cfg, when already computed (it does not depend on the budget); computed here otherwise."""
    n_sel = budget - 2 if (cfg.matched and cfg.sinks) else budget
    if n_sel < 1:
        raise ValueError(f"budget {budget} leaves no selected token")
    e = energy(z, cls_attn, cfg, attn) if e is None else e
    kept = np.stack([allocate(e[b], grid, n_sel, cfg) for b in range(len(z))])
    out = []
    for b in range(len(z)):
        rows = [z[b, kept[b]]]
        if cfg.sinks:
            rows.append(coreset_sinks(z[b], kept[b]))
        out.append(np.concatenate(rows))
    return np.stack(out), kept
