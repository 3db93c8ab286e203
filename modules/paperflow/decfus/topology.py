"""The communication graph of the clients (spec §2.1) and the mixing weights built on it."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

# The official code's 10-client graph, 1-indexed as written there (spec §2.1).
PAPER_GRAPH_1_INDEXED = {
    1: [2, 8, 9, 5],
    2: [1, 6, 10, 3],
    3: [2, 8, 10, 4],
    4: [3, 10, 5, 7],
    5: [4, 10, 1, 6],
    6: [5, 2, 9, 7],
    7: [8, 9, 4, 6],
    8: [1, 3, 9, 7],
    9: [8, 7, 1, 6],
    10: [2, 3, 4, 5],
}

Neighbours = list[list[int]]


def paper_topology() -> Neighbours:
    """0-indexed neighbour lists N(i) (i excluded), in the official code's order."""
    return [[j - 1 for j in PAPER_GRAPH_1_INDEXED[i + 1]] for i in range(len(PAPER_GRAPH_1_INDEXED))]


def closed_neighbourhood(neighbours: Neighbours, i: int) -> list[int]:
    """{i} ∪ N(i), own index first."""
    return [i, *neighbours[i]]


def adjacency(neighbours: Neighbours) -> np.ndarray:
    m = len(neighbours)
    a = np.zeros((m, m), dtype=int)
    for i, row in enumerate(neighbours):
        a[i, row] = 1
    return a


def diameter(neighbours: Neighbours) -> int:
    """Longest shortest path (breadth-first search from every node)."""
    worst = 0
    for start in range(len(neighbours)):
        dist = {start: 0}
        queue = deque([start])
        while queue:
            u = queue.popleft()
            for v in neighbours[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        if len(dist) < len(neighbours):
            raise ValueError("the graph is not connected")
        worst = max(worst, max(dist.values()))
    return worst


def check_topology(neighbours: Neighbours) -> None:
    """ValueError unless the graph is undirected, simple (no self loops, no repeated edges) and connected."""
    a = adjacency(neighbours)
    if any(i in row for i, row in enumerate(neighbours)) or any(len(set(r)) != len(r) for r in neighbours):
        raise ValueError("neighbour lists must exclude the client itself and have no repeats")
    if not np.array_equal(a, a.T):
        raise ValueError("the graph is not symmetric")
    diameter(neighbours)


def uniform_mixing(neighbours: Neighbours) -> np.ndarray:
    """DFedAvg / DFLAvg: row i averages {i} ∪ N(i) with equal weights 1/(|N(i)|+1)."""
    m = len(neighbours)
    w = np.zeros((m, m))
    for i in range(m):
        nb = closed_neighbourhood(neighbours, i)
        w[i, nb] = 1.0 / len(nb)
    return w


def metropolis_mixing(neighbours: Neighbours) -> np.ndarray:
    """D-PSGD's symmetric, doubly stochastic Metropolis-Hastings weights (1/5 everywhere on a 4-regular graph)."""
    m = len(neighbours)
    w = np.zeros((m, m))
    for i in range(m):
        for j in neighbours[i]:
            w[i, j] = 1.0 / (1 + max(len(neighbours[i]), len(neighbours[j])))
        w[i, i] = 1.0 - w[i].sum()
    return w


def sample_weighted_mixing(neighbours: Neighbours, n: Sequence[float]) -> np.ndarray:
    """DecFus's averaging rows: w_ij = n_j / Σ_{k∈{i}∪N(i)} n_k; rows sum to 1, columns in general do not."""
    n = np.asarray(n, dtype=float)
    m = len(neighbours)
    w = np.zeros((m, m))
    for i in range(m):
        nb = closed_neighbourhood(neighbours, i)
        w[i, nb] = n[nb] / n[nb].sum()
    return w


def global_mixing(n: Sequence[float]) -> np.ndarray:
    """Centralised FedAvg: every client receives the sample-weighted mean of all clients."""
    n = np.asarray(n, dtype=float)
    return np.tile(n / n.sum(), (len(n), 1))
