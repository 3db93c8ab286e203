"""The training-free baselines of spec section 3 on the smoke's 8 x 8 grid, vectorised over a batch (numpy).

Each takes a `Tokens` batch and a budget K and returns (tokens fed to the reader (B, K, d), kept indices (B, K) or
None for a method whose tokens are merges). FastV prunes inside the reader (paperflow.specflow.model.Reader).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paperflow.specflow.specflow import EPS, quotas, top_indices


@dataclass(frozen=True)
class Tokens:
    """One batch of encoder outputs for the test split (spec section 6, extract_tokens)."""

    z: np.ndarray  # (B, N, d) projector outputs of the patch tokens
    cls: np.ndarray  # (B, N) [CLS] -> patch attention of the seed layer, heads averaged
    cls_heads: np.ndarray  # (B, H, N) the same per head (VisionZip sums over heads)
    keys: np.ndarray  # (B, N + 1, d_head) the seed layer's keys averaged over heads, [CLS] first
    attn: np.ndarray  # (B, N, N) the seed layer's patch -> patch attention, heads averaged
    grid: tuple[int, int]

    def __getitem__(self, sl: slice) -> Tokens:
        return Tokens(self.z[sl], self.cls[sl], self.cls_heads[sl], self.keys[sl], self.attn[sl], self.grid)

    def __len__(self) -> int:
        return len(self.z)


def gather(z: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return np.take_along_axis(z, idx[..., None], axis=1)


def batch_top(values: np.ndarray, k: int) -> np.ndarray:
    """(B, k) indices of each row's k largest values (ties to the lower index), in index order."""
    order = np.argsort(-values, axis=1, kind="stable")[:, :k]
    return np.sort(order, axis=1)


def full(t: Tokens, budget: int, rng: np.random.Generator):
    n = t.z.shape[1]
    idx = np.broadcast_to(np.arange(n), (len(t), n))
    return t.z, idx


def random_keep(t: Tokens, budget: int, rng: np.random.Generator):
    idx = np.sort(np.argsort(rng.random(t.cls.shape), axis=1)[:, :budget], axis=1)
    return gather(t.z, idx), idx


def uniform_pool(t: Tokens, budget: int, rng: np.random.Generator):
    """Average pooling over K contiguous groups of the row-major raster (no token kept as is)."""
    groups = np.array_split(np.arange(t.z.shape[1]), budget)
    return np.stack([t.z[:, g].mean(axis=1) for g in groups], axis=1), None


def cls_topk(t: Tokens, budget: int, rng: np.random.Generator):
    """[CLS]-attention Top-K (FasterVLM-like; SpecFlow with alpha = 0, one leaf, no sinks)."""
    idx = batch_top(t.cls, budget)
    return gather(t.z, idx), idx


def hired(t: Tokens, budget: int, rng: np.random.Generator, parts: int = 2):
    """HiRED: the budget split over a parts x parts partition in proportion to its [CLS] attention mass, then
    [CLS] Top-K inside each partition."""
    h, w = t.grid
    idx_map = np.arange(h * w).reshape(h, w)
    members = [
        blk.ravel() for rows in np.array_split(idx_map, parts, axis=0) for blk in np.array_split(rows, parts, axis=1)
    ]
    kept = []
    for b in range(len(t)):
        q = quotas(np.array([t.cls[b, mm].sum() for mm in members]), np.array([len(mm) for mm in members]), budget)
        kept.append(np.sort(np.concatenate([mm[top_indices(t.cls[b, mm], qc)] for mm, qc in zip(members, q)])))
    idx = np.stack(kept)
    return gather(t.z, idx), idx


def visionzip_split(budget: int) -> tuple[int, int]:
    """(dominant, contextual): VisionZip's 54 + 10 of 64, scaled to K (at least one contextual token)."""
    contextual = max(1, round(budget * 10 / 64))
    return budget - contextual, contextual


def visionzip(t: Tokens, budget: int, rng: np.random.Generator):
    """VisionZip (its `visionzip` selection, vectorised): dominant = Top-K of the [CLS] attention summed over heads;
    the rest are merged into `contextual` targets taken at a uniform stride, each joining its most key-similar
    target; a contextual token is target + the mean of its group (the published code's arithmetic). Patch tokens
    only: our reader takes no [CLS]."""
    dominant, contextual = visionzip_split(budget)
    b, n, d = t.z.shape
    dom = batch_top(t.cls_heads.sum(axis=1), dominant)
    rest_mask = np.ones((b, n), dtype=bool)
    np.put_along_axis(rest_mask, dom, False, axis=1)
    rest = np.nonzero(rest_mask)[1].reshape(b, n - dominant)
    metric = gather(t.keys[:, 1:], rest)
    metric = metric / np.linalg.norm(metric, axis=-1, keepdims=True)
    step = max(1, (n - dominant) // contextual)
    targets = np.arange(0, n - dominant, step)[:contextual]
    others = np.setdiff1d(np.arange(n - dominant), targets)
    sim = metric[:, others] @ np.swapaxes(metric[:, targets], 1, 2)
    assign = np.zeros((b, len(others), contextual))
    np.put_along_axis(assign, sim.argmax(axis=2)[..., None], 1.0, axis=2)
    counts = np.maximum(assign.sum(axis=1), 1)[..., None]
    z_rest = gather(t.z, rest)
    ctx = z_rest[:, targets] + np.swapaxes(assign, 1, 2) @ z_rest[:, others] / counts
    return np.concatenate([gather(t.z, dom), ctx], axis=1), dom


def prumerge(t: Tokens, budget: int, rng: np.random.Generator, k: int = 4):
    """LLaVA-PruMerge at a fixed budget: the IQR outliers of [CLS] attention first, filled up (or cut) to K by
    [CLS] rank; each kept token becomes the [CLS]-attention-weighted mean of itself and its k most key-similar
    tokens."""
    q1, q3 = np.percentile(t.cls, [25, 75], axis=1)
    outlier = t.cls > (q3 + 1.5 * (q3 - q1))[:, None]
    idx = batch_top(t.cls + outlier.astype(float), budget)  # outliers outrank the rest, then [CLS] order
    keys = t.keys[:, 1:] / np.linalg.norm(t.keys[:, 1:], axis=-1, keepdims=True)
    sim = gather(keys, idx) @ np.swapaxes(keys, 1, 2)  # (B, K, N)
    np.put_along_axis(sim, idx[..., None], np.inf, axis=2)  # itself first
    nbr = np.argsort(-sim, axis=2, kind="stable")[:, :, : k + 1]
    weights = np.take_along_axis(np.broadcast_to(t.cls[:, None, :], sim.shape), nbr, axis=2)
    members = t.z[np.arange(len(t))[:, None, None], nbr]  # (B, K, k+1, d)
    merged = (weights[..., None] * members).sum(axis=2) / (weights.sum(axis=2)[..., None] + EPS)
    return merged, idx


def tome(t: Tokens, budget: int, rng: np.random.Generator):
    """ToMe merge-to-K: rounds of bipartite soft matching (alternate tokens A / B, each A's best B by key cosine,
    the r most similar edges merged, size-weighted means) until K tokens remain. Applied to the encoder's output
    tokens once (not inside every ViT block)."""
    z, keys = t.z.copy(), t.keys[:, 1:].copy()
    size = np.ones(z.shape[:2])
    while z.shape[1] > budget:
        n = z.shape[1]
        a_idx, b_idx = np.arange(0, n, 2), np.arange(1, n, 2)
        r = min(n - budget, len(a_idx))
        kn = keys / np.linalg.norm(keys, axis=-1, keepdims=True)
        sim = kn[:, a_idx] @ np.swapaxes(kn[:, b_idx], 1, 2)
        best, best_val = sim.argmax(axis=2), sim.max(axis=2)
        order = np.argsort(-best_val, axis=1, kind="stable")
        merged_a, kept_a = np.sort(order[:, :r], axis=1), np.sort(order[:, r:], axis=1)
        new_z, new_k, new_s = [], [], []
        for bi in range(len(z)):
            zb, kb, sb = z[bi, b_idx] * size[bi, b_idx, None], keys[bi, b_idx] * size[bi, b_idx, None], size[bi, b_idx]
            src = a_idx[merged_a[bi]]
            dst = best[bi, merged_a[bi]]
            np.add.at(zb, dst, z[bi, src] * size[bi, src, None])
            np.add.at(kb, dst, keys[bi, src] * size[bi, src, None])
            np.add.at(sb, dst, size[bi, src])
            keep = a_idx[kept_a[bi]]
            new_z.append(np.concatenate([z[bi, keep], zb / sb[:, None]]))
            new_k.append(np.concatenate([keys[bi, keep], kb / sb[:, None]]))
            new_s.append(np.concatenate([size[bi, keep], sb]))
        z, keys, size = np.stack(new_z), np.stack(new_k), np.stack(new_s)
    return z, None


def divprune(t: Tokens, budget: int, rng: np.random.Generator):
    """DivPrune: greedy max-min diversity on cosine distance of z, from the token farthest from the others on
    average."""
    zn = t.z / np.linalg.norm(t.z, axis=-1, keepdims=True)
    dist = 1 - zn @ np.swapaxes(zn, 1, 2)
    rows = np.arange(len(t))
    chosen = [dist.mean(axis=2).argmax(axis=1)]
    mind = dist[rows, chosen[0]]
    for _ in range(budget - 1):
        masked = mind.copy()
        masked[rows[:, None], np.stack(chosen, axis=1)] = -np.inf
        nxt = masked.argmax(axis=1)
        chosen.append(nxt)
        mind = np.minimum(mind, dist[rows, nxt])
    idx = np.sort(np.stack(chosen, axis=1), axis=1)
    return gather(t.z, idx), idx


BASELINES = {
    "full": full,
    "random": random_keep,
    "uniform_pool": uniform_pool,
    "topk": cls_topk,
    "hired": hired,
    "visionzip": visionzip,
    "prumerge": prumerge,
    "tome": tome,
    "divprune": divprune,
}
