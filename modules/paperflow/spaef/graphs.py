"""Spot and gene graphs (§2.2, §2.3): Delaunay edges, top-k cosine neighbours on a latent,
expression kNN (the no-LM spot graph), top-k correlation candidates and the interaction classifier."""

from __future__ import annotations

import logging

import numpy as np
from scipy.spatial import Delaunay
from sklearn.linear_model import LogisticRegression

log = logging.getLogger(__name__)


def delaunay_edges(coords: np.ndarray) -> np.ndarray:
    """Unique undirected edges (i < j) of the Delaunay triangulation of the coordinates, (E, 2), sorted."""
    tri = Delaunay(np.asarray(coords, dtype=float))
    s = tri.simplices
    pairs = np.concatenate([s[:, [0, 1]], s[:, [1, 2]], s[:, [0, 2]]])
    pairs = np.sort(pairs, axis=1)
    return np.unique(pairs, axis=0)


def symmetric(edges: np.ndarray) -> np.ndarray:
    """Both directions of every edge, duplicates and self-loops removed, (E', 2) sorted."""
    both = np.concatenate([edges, edges[:, ::-1]])
    both = both[both[:, 0] != both[:, 1]]
    return np.unique(both, axis=0)


def upper(edges: np.ndarray) -> np.ndarray:
    """The released code's direction convention: each unordered pair once, as i < j."""
    return np.unique(np.sort(edges, axis=1), axis=0)


def cosine_topk(z: np.ndarray, k: int) -> np.ndarray:
    """(N, k) indices of each row's k most cosine-similar other rows (top k+1, self dropped)."""
    zn = z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
    sim = zn @ zn.T
    np.fill_diagonal(sim, -np.inf)
    idx = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    return idx


def knn_edges(neighbours: np.ndarray) -> np.ndarray:
    """Directed (i, neighbour) pairs from a (N, k) neighbour table."""
    n, k = neighbours.shape
    return np.column_stack([np.repeat(np.arange(n), k), neighbours.ravel()])


def correlation_candidates(x: np.ndarray, k: int, usable: np.ndarray | None = None) -> np.ndarray:
    """Unordered pairs (a < b) of genes among each gene's k most Pearson-correlated other genes
    across spots (genes in `usable` only; constant genes have no candidates)."""
    g = x.shape[1]
    usable = np.ones(g, bool) if usable is None else np.asarray(usable, bool)
    usable &= x.std(0) > 0
    cols = np.flatnonzero(usable)
    corr = np.corrcoef(x[:, cols].T)
    np.fill_diagonal(corr, -np.inf)
    top = np.argsort(-corr, axis=1, kind="stable")[:, :k]
    pairs = cols[knn_edges(top)]
    return upper(pairs)


def train_ggi(emb_a: np.ndarray, emb_b: np.ndarray, labels: np.ndarray, seed: int = 42) -> LogisticRegression:
    """§2.3.2: logistic regression on g_a + g_b (order-invariant), balanced classes."""
    clf = LogisticRegression(max_iter=5000, class_weight="balanced", random_state=seed)
    return clf.fit(emb_a + emb_b, labels)


def filter_pairs(
    pairs: np.ndarray, gene_emb: np.ndarray, clf: LogisticRegression, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """Candidates whose predicted interaction probability is >= threshold; returns (kept pairs, probabilities)."""
    if len(pairs) == 0:
        return pairs, np.zeros(0)
    prob = clf.predict_proba(gene_emb[pairs[:, 0]] + gene_emb[pairs[:, 1]])[:, 1]
    return pairs[prob >= threshold], prob
