"""In-project baselines (spec §3): raw log1p-CPM, neighbour smoothing on the Delaunay graph and a
MAGIC-style diffusion on an expression kNN graph."""

from __future__ import annotations

import numpy as np
from scipy import sparse
from sklearn.decomposition import PCA
from sklearn.neighbors import NearestNeighbors


def delaunay_smooth(x: np.ndarray, adjacency: sparse.spmatrix, alpha: float) -> np.ndarray:
    """x_i <- (1 - alpha) x_i + alpha * mean_{j in N(i)} x_j on the (binary) spatial graph."""
    a = sparse.csr_matrix(adjacency, dtype=np.float64)
    a.data[:] = 1.0
    deg = np.asarray(a.sum(1)).ravel()
    mean = (a @ x) / np.maximum(deg, 1)[:, None]
    return (1 - alpha) * x + alpha * np.where(deg[:, None] > 0, mean, x)


def magic(x: np.ndarray, k: int, t: int, n_pcs: int, seed: int = 0) -> np.ndarray:
    """MAGIC-style imputation: symmetric kNN affinity on the expression PCs (Gaussian kernel with each
    spot's k-th neighbour distance as bandwidth), row-normalised Markov matrix P, output P^t X."""
    pcs = PCA(n_components=min(n_pcs, *x.shape) - 1 or 1, random_state=seed).fit_transform(x)
    dist, idx = NearestNeighbors(n_neighbors=k + 1).fit(pcs).kneighbors(pcs)
    sigma = np.maximum(dist[:, -1], 1e-12)
    n = len(x)
    w = np.exp(-(dist / sigma[:, None]) ** 2)
    kernel = sparse.csr_matrix((w.ravel(), (np.repeat(np.arange(n), k + 1), idx.ravel())), shape=(n, n))
    kernel = kernel + kernel.T
    p = sparse.diags(1.0 / np.asarray(kernel.sum(1)).ravel()) @ kernel
    out = x.astype(np.float64)
    for _ in range(t):
        out = p @ out
    return out


def run_baselines(x: np.ndarray, adjacency: sparse.spmatrix, names: list[str], cfg: dict) -> dict[str, np.ndarray]:
    impl = {
        "raw": lambda: np.asarray(x, dtype=np.float64),
        "delaunay_smooth": lambda: delaunay_smooth(x, adjacency, cfg["smooth_alpha"]),
        "magic": lambda: magic(x, cfg["magic_k"], cfg["magic_t"], cfg["magic_pcs"]),
    }
    return {name: impl[name]() for name in names}
