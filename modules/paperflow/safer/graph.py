"""Graph operators: the kNN graph of the smoke stand-in, induced task subgraphs, the GCN-normalised
adjacency Â = D̃^{-1/2}(A + I)D̃^{-1/2} and parameter-free Laplacian smoothing Â^k X."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from sklearn.neighbors import NearestNeighbors

from paperflow.safer.sources import symmetrise


def knn_graph(x: np.ndarray, k: int) -> sp.csr_matrix:
    """Symmetric binary cosine kNN graph (i ~ j when either is among the other's k nearest), no self loops."""
    nn_index = NearestNeighbors(n_neighbors=k + 1, metric="cosine", algorithm="brute").fit(x)
    _, idx = nn_index.kneighbors(x)
    rows = np.repeat(np.arange(len(x)), k)
    cols = idx[:, 1:].reshape(-1)  # column 0 is the point itself
    return symmetrise(sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(x), len(x))))


def within_groups(adj: sp.csr_matrix, group: np.ndarray) -> sp.csr_matrix:
    """The adjacency with every edge between nodes of different groups (tasks) removed; nodes with
    group -1 keep no edge. The result is block diagonal up to a permutation: one block per task graph."""
    coo = adj.tocoo()
    keep = (group[coo.row] == group[coo.col]) & (group[coo.row] >= 0)
    out = sp.csr_matrix((coo.data[keep], (coo.row[keep], coo.col[keep])), shape=adj.shape)
    out.sort_indices()
    return out


def gcn_norm(adj: sp.spmatrix) -> sp.csr_matrix:
    """Â = D̃^{-1/2}(A + I)D̃^{-1/2} with D̃ the degree of A + I (Kipf & Welling; SGC; TPP)."""
    a_tilde = sp.csr_matrix(adj, dtype=np.float64) + sp.identity(adj.shape[0], format="csr")
    d_inv_sqrt = 1.0 / np.sqrt(np.asarray(a_tilde.sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(d_inv_sqrt) @ a_tilde @ sp.diags(d_inv_sqrt))


def smooth(a_hat: sp.spmatrix, x: np.ndarray, k: int) -> np.ndarray:
    """Â^k X by k sparse products (never the dense power)."""
    out = np.asarray(x, dtype=np.float64)
    for _ in range(k):
        out = a_hat @ out
    return out


def to_torch(a_hat: sp.spmatrix) -> torch.Tensor:
    """A scipy sparse matrix as a coalesced float32 torch COO tensor (sparse @ dense supports autograd on the dense side)."""
    coo = sp.coo_matrix(a_hat, dtype=np.float32)
    index = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
    return torch.sparse_coo_tensor(index, torch.from_numpy(coo.data), size=coo.shape).coalesce()


def propagate(a_hat: torch.Tensor, x: torch.Tensor, k: int) -> torch.Tensor:
    """Â^k x for a torch sparse Â."""
    for _ in range(k):
        x = a_hat @ x
    return x


def submatrix(a: sp.spmatrix, nodes: np.ndarray) -> sp.csr_matrix:
    """Rows and columns `nodes` of `a` (a task's own block of the block-diagonal Â)."""
    return sp.csr_matrix(sp.csr_matrix(a)[nodes][:, nodes])
