"""Readers for the four CGLB node-classification benchmarks as downloaded, and one `.npz` cache format.

CoraFull: graph2gauss `cora.npz` (CSR adjacency and attributes, int labels; attributes kept as stored,
as DGL's CoraFullDataset does, not binarised as PyG does). ogbn-arxiv / ogbn-products: the OGB
nodeproppred zip (`<name>/raw/{edge,node-feat,node-label}.csv.gz`). Reddit: DGL's `reddit.zip`
(`reddit_data.npz` with `feature`/`label`, `reddit_graph.npz` from `scipy.sparse.save_npz`).
Every adjacency is made undirected, binary and loop-free by `symmetrise`.
"""

from __future__ import annotations

import logging
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

log = logging.getLogger(__name__)

G2G_KEYS = (
    "adj_data",
    "adj_indices",
    "adj_indptr",
    "adj_shape",
    "attr_data",
    "attr_indices",
    "attr_indptr",
    "attr_shape",
    "labels",
)


@dataclass(frozen=True)
class Graph:
    features: np.ndarray  # (n, d) float32
    labels: np.ndarray  # (n,) int64, classes 0..C-1
    adjacency: sp.csr_matrix  # (n, n) symmetric, binary float32, no self loops, canonical
    name: str


def symmetrise(adj: sp.spmatrix | sp.sparray) -> sp.csr_matrix:
    """A ∨ Aᵀ as a binary float32 CSR matrix without diagonal, explicit zeros or duplicates, indices sorted."""
    coo = sp.coo_matrix(adj)
    if coo.shape[0] != coo.shape[1]:
        raise ValueError(f"adjacency is not square: shape {coo.shape}")
    keep = (coo.data != 0) & (coo.row != coo.col)
    rows = np.concatenate([coo.row[keep], coo.col[keep]])
    cols = np.concatenate([coo.col[keep], coo.row[keep]])
    out = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=coo.shape)
    out.sum_duplicates()  # canonical (summed, sorted) whatever the scipy version; a no-op flag check in 1.17
    out.data[:] = 1.0
    return out


def _labels(values: np.ndarray, source: str) -> np.ndarray:
    """Labels as int64 (n,); integral floats (e.g. a CSV read as float) are accepted."""
    values = np.asarray(values).reshape(-1)
    if not np.issubdtype(values.dtype, np.integer):
        if not np.issubdtype(values.dtype, np.floating) or not np.all(
            np.isfinite(values) & (values == np.round(values))
        ):
            raise ValueError(f"{source}: labels are not integers (dtype {values.dtype})")
    return values.astype(np.int64)


def _graph(features: np.ndarray, labels: np.ndarray, adjacency: sp.spmatrix, name: str, source: str) -> Graph:
    """Validate the pieces read from `source` and assemble the Graph (adjacency symmetrised)."""
    features = np.asarray(features, dtype=np.float32)
    labels = _labels(labels, source)
    if features.ndim != 2:
        raise ValueError(f"{source}: features must be 2-D, got shape {features.shape}")
    n = len(labels)
    if features.shape[0] != n:
        raise ValueError(f"{source}: {features.shape[0]} feature rows != {n} label rows")
    if n and labels.min() < 0:
        raise ValueError(f"{source}: negative labels (min {labels.min()})")
    if adjacency.shape[0] != adjacency.shape[1]:
        raise ValueError(f"{source}: adjacency is not square: shape {adjacency.shape}")
    if adjacency.shape[0] != n:
        raise ValueError(f"{source}: adjacency size {adjacency.shape[0]} != {n} nodes")
    graph = Graph(features, labels, symmetrise(adjacency), name)
    log.info(
        "read %s from %s: %d nodes, %d edges, %d features, %d classes",
        name,
        source,
        n,
        graph.adjacency.nnz // 2,
        features.shape[1],
        int(labels.max()) + 1 if n else 0,
    )
    return graph


def read_graph2gauss_npz(path: str | Path, name: str) -> Graph:
    """CoraFull's graph2gauss `cora.npz`; keys other than the CSR adjacency/attributes and labels are ignored."""
    with np.load(path, allow_pickle=False) as f:
        missing = [k for k in G2G_KEYS if k not in f.files]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        adj = sp.csr_matrix((f["adj_data"], f["adj_indices"], f["adj_indptr"]), shape=tuple(f["adj_shape"]))
        attr = sp.csr_matrix((f["attr_data"], f["attr_indices"], f["attr_indptr"]), shape=tuple(f["attr_shape"]))
        labels = f["labels"]
    return _graph(attr.toarray(), labels, adj, name, str(path))


def _member(archive: zipfile.ZipFile, suffix: str, path: str | Path) -> str:
    """The one member named `suffix` or ending in `/suffix`, whatever folder it sits in."""
    found = [m for m in archive.namelist() if m == suffix or m.endswith("/" + suffix)]
    if len(found) != 1:
        problem = "missing member" if not found else f"several members {found} for"
        raise ValueError(f"{path}: {problem} '{suffix}'")
    return found[0]


def read_ogb_zip(path: str | Path, name: str) -> Graph:
    """An OGB nodeproppred zip (arxiv.zip, products.zip): raw edge list, node features and labels."""
    with zipfile.ZipFile(path) as archive:
        members = {part: _member(archive, f"raw/{part}.csv.gz", path) for part in ("edge", "node-feat", "node-label")}

        def csv(part: str, dtype: type | None) -> np.ndarray:
            with archive.open(members[part]) as fh:
                return pd.read_csv(fh, compression="gzip", header=None, dtype=dtype).to_numpy()

        edges = csv("edge", np.int64)
        features = csv("node-feat", np.float32)
        labels = csv("node-label", None)
    n = len(features)
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise ValueError(f"{path}: edge list must have 2 columns, got shape {edges.shape}")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        raise ValueError(f"{path}: edge endpoints outside 0..{n - 1}")
    adj = sp.coo_matrix((np.ones(len(edges), dtype=np.float32), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return _graph(features, labels, adj, name, str(path))


def read_dgl_reddit_zip(path: str | Path, name: str) -> Graph:
    """DGL's reddit.zip; both npz members are extracted to a temporary directory (a zip member is only
    seekable by re-decompressing it, which a nested npz would do once per array)."""
    with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory() as tmp:
        data_path = archive.extract(_member(archive, "reddit_data.npz", path), tmp)
        graph_path = archive.extract(_member(archive, "reddit_graph.npz", path), tmp)
        with np.load(data_path, allow_pickle=False) as f:
            missing = [k for k in ("feature", "label") if k not in f.files]
            if missing:
                raise ValueError(f"{path}: reddit_data.npz is missing key(s) {missing}")
            features, labels = f["feature"], f["label"]
        try:
            adj = sp.load_npz(graph_path)
        except (KeyError, ValueError) as err:
            raise ValueError(f"{path}: reddit_graph.npz is not a scipy sparse matrix ({err})") from err
    return _graph(features, labels, adj, name, str(path))


def drop_classes(graph: Graph, classes: Sequence[int]) -> Graph:
    """The graph without the nodes of `classes` (and their edges). Only the largest class ids may be
    dropped (CGLB drops Reddit's and Products' last class), so the kept ids stay 0..C'-1 unchanged."""
    n_classes = int(graph.labels.max()) + 1
    drop = set(int(c) for c in classes)
    if drop != set(range(n_classes - len(drop), n_classes)):
        raise ValueError(f"{graph.name}: can only drop the largest class ids of 0..{n_classes - 1}, got {sorted(drop)}")
    keep = np.flatnonzero(graph.labels < n_classes - len(drop))
    adjacency = sp.csr_matrix(graph.adjacency[keep][:, keep])
    adjacency.sort_indices()
    return Graph(graph.features[keep], graph.labels[keep], adjacency, graph.name)


READERS: dict[str, Callable[[str | Path, str], Graph]] = {
    "graph2gauss_npz": read_graph2gauss_npz,
    "ogb_zip": read_ogb_zip,
    "dgl_reddit_zip": read_dgl_reddit_zip,
}


def read_source(fmt: str, path: str | Path, name: str) -> Graph:
    """Read `path` with the reader registered for `fmt`."""
    if fmt not in READERS:
        raise ValueError(f"unknown source format {fmt!r}; allowed: {sorted(READERS)}")
    return READERS[fmt](path, name)


def save_graph(graph: Graph, path: str | Path) -> None:
    """Write the graph to exactly `path` (compressed npz; the adjacency as its CSR pattern)."""
    adj = graph.adjacency
    with open(path, "wb") as fh:
        np.savez_compressed(
            fh,
            features=graph.features,
            labels=graph.labels,
            adj_indptr=adj.indptr,
            adj_indices=adj.indices,
            adj_shape=np.asarray(adj.shape, dtype=np.int64),
            name=np.asarray(graph.name),
        )


def load_graph(path: str | Path) -> Graph:
    """A graph written by `save_graph`."""
    with np.load(path, allow_pickle=False) as f:
        missing = [
            k for k in ("features", "labels", "adj_indptr", "adj_indices", "adj_shape", "name") if k not in f.files
        ]
        if missing:
            raise ValueError(f"{path}: missing key(s) {missing}")
        indices = f["adj_indices"]
        adj = sp.csr_matrix(
            (np.ones(len(indices), dtype=np.float32), indices, f["adj_indptr"]), shape=tuple(f["adj_shape"])
        )
        return _graph(f["features"], f["labels"], adj, str(f["name"]), str(path))
