"""safer sources: each reader on a tiny file in the real layout returns exactly the arrays written, with the
adjacency made symmetric, binary and loop-free; class dropping, the npz cache and the error messages."""

from __future__ import annotations

import gzip
import io
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp

from paperflow.safer.sources import (
    Graph,
    drop_classes,
    load_graph,
    read_dgl_reddit_zip,
    read_graph2gauss_npz,
    read_ogb_zip,
    read_source,
    save_graph,
    symmetrise,
)

N = 7
# directed source edges with a duplicate (0->1 twice), a reverse pair (2->3, 3->2) and a self loop (4->4)
EDGES = np.array([[0, 1], [0, 1], [1, 2], [2, 3], [3, 2], [4, 4], [4, 5], [6, 0]])
UNDIRECTED = {(0, 1), (1, 2), (2, 3), (4, 5), (0, 6)}
FEATURES = (np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4.0) - 1.5
LABELS = np.array([0, 1, 2, 1, 0, 2, 1], dtype=np.int64)


def expected_dense() -> np.ndarray:
    dense = np.zeros((N, N), dtype=np.float32)
    for i, j in UNDIRECTED:
        dense[i, j] = dense[j, i] = 1.0
    return dense


def source_adjacency() -> sp.csr_matrix:
    """Unsummed duplicate entry kept as stored (csr built from raw arrays, not from triplets)."""
    order = np.argsort(EDGES[:, 0], kind="stable")
    rows, cols = EDGES[order, 0], EDGES[order, 1]
    indptr = np.searchsorted(rows, np.arange(N + 1))
    return sp.csr_matrix((np.ones(len(rows), dtype=np.float32), cols, indptr), shape=(N, N))


def assert_graph(graph: Graph, features=FEATURES, labels=LABELS, dense=None) -> None:
    dense = expected_dense() if dense is None else dense
    assert graph.features.dtype == np.float32 and np.array_equal(graph.features, features)
    assert graph.labels.dtype == np.int64 and np.array_equal(graph.labels, labels)
    adj = graph.adjacency
    assert isinstance(adj, sp.csr_matrix) and adj.dtype == np.float32
    assert np.array_equal(adj.toarray(), dense)
    assert np.all(adj.data == 1.0) and adj.has_canonical_format and adj.diagonal().sum() == 0
    assert (adj != adj.T).nnz == 0


def write_g2g(path, drop: str | None = None) -> None:
    adj = source_adjacency()
    attr = sp.csr_matrix(FEATURES)
    arrays = dict(
        adj_data=adj.data,
        adj_indices=adj.indices,
        adj_indptr=adj.indptr,
        adj_shape=np.array(adj.shape),
        attr_data=attr.data,
        attr_indices=attr.indices,
        attr_indptr=attr.indptr,
        attr_shape=np.array(attr.shape),
        labels=LABELS,
        class_names=np.array(["a", "b", "c"]),
        idx_to_node=np.array([{0: "x"}], dtype=object),
    )  # a pickled extra key, never read
    arrays.pop(drop, None)
    np.savez(path, **arrays)


def gz_csv(rows: np.ndarray, fmt: str) -> bytes:
    return gzip.compress("".join(",".join(fmt % v for v in np.atleast_1d(r)) + "\n" for r in rows).encode())


def write_ogb(path, folder: str = "arxiv", skip: str | None = None, labels=LABELS) -> None:
    members = {
        "edge": gz_csv(EDGES, "%d"),
        "node-feat": gz_csv(FEATURES, "%.6f"),
        "node-label": gz_csv(labels, "%d"),
        "node_year": gz_csv(np.full(N, 2020), "%d"),
    }
    with zipfile.ZipFile(path, "w") as zf:
        for part, blob in members.items():
            if part != skip:
                zf.writestr(f"{folder}/raw/{part}.csv.gz", blob)
        zf.writestr(f"{folder}/split/time/train.csv.gz", gz_csv(np.arange(3), "%d"))


def write_reddit(path, data_keys=("feature", "label", "node_types")) -> None:
    arrays = {"feature": FEATURES, "label": LABELS, "node_types": np.array([1, 1, 2, 3, 1, 2, 3])}
    data, graph = io.BytesIO(), io.BytesIO()
    np.savez(data, **{k: arrays[k] for k in data_keys})
    sp.save_npz(graph, source_adjacency().tocoo())
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("reddit_data.npz", data.getvalue())
        zf.writestr("reddit_graph.npz", graph.getvalue())


def test_symmetrise_or_binary_no_loops_no_zeros():
    # weights 2, 3, 5 count as edges; the stored zero at (1, 2) does not; the loop at (2, 2) goes
    a = sp.csr_matrix(
        (np.array([2.0, 3.0, 0.0, 5.0, 1.0]), np.array([0, 1, 2, 0, 2]), np.array([0, 2, 3, 5])), shape=(3, 3)
    )
    out = symmetrise(a)
    assert np.array_equal(out.toarray(), [[0, 1, 1], [1, 0, 0], [1, 0, 0]])
    assert out.dtype == np.float32 and out.nnz == 4 and out.has_canonical_format
    with pytest.raises(ValueError, match="not square"):
        symmetrise(sp.csr_matrix((2, 3)))


def test_graph2gauss_npz_with_extra_keys(tmp_path):
    write_g2g(tmp_path / "cora.npz")
    graph = read_graph2gauss_npz(tmp_path / "cora.npz", "corafull")
    assert graph.name == "corafull"
    assert_graph(graph)


def test_graph2gauss_missing_key(tmp_path):
    write_g2g(tmp_path / "cora.npz", drop="attr_indptr")
    with pytest.raises(ValueError, match=r"cora\.npz.*attr_indptr"):
        read_graph2gauss_npz(tmp_path / "cora.npz", "corafull")


@pytest.mark.parametrize("folder", ["arxiv", "products"])
def test_ogb_zip_under_any_top_level_folder(tmp_path, folder):
    write_ogb(tmp_path / f"{folder}.zip", folder)
    graph = read_source("ogb_zip", tmp_path / f"{folder}.zip", f"ogbn-{folder}")
    assert graph.name == f"ogbn-{folder}"
    assert_graph(graph)


def test_ogb_zip_missing_member(tmp_path):
    write_ogb(tmp_path / "arxiv.zip", skip="node-label")
    with pytest.raises(ValueError, match=r"arxiv\.zip: missing member 'raw/node-label\.csv\.gz'"):
        read_ogb_zip(tmp_path / "arxiv.zip", "ogbn-arxiv")


def test_ogb_zip_rejects_bad_labels(tmp_path):
    write_ogb(tmp_path / "a.zip", labels=LABELS[:-1])
    with pytest.raises(ValueError, match=r"a\.zip: 7 feature rows != 6 label rows"):
        read_ogb_zip(tmp_path / "a.zip", "x")
    write_ogb(tmp_path / "b.zip", labels=np.where(LABELS == 2, -1, LABELS))
    with pytest.raises(ValueError, match=r"b\.zip: negative labels"):
        read_ogb_zip(tmp_path / "b.zip", "x")


def test_dgl_reddit_zip(tmp_path):
    write_reddit(tmp_path / "reddit.zip")
    assert_graph(read_source("dgl_reddit_zip", tmp_path / "reddit.zip", "reddit"))


def test_dgl_reddit_missing_key(tmp_path):
    write_reddit(tmp_path / "reddit.zip", data_keys=("feature", "node_types"))
    with pytest.raises(ValueError, match=r"reddit\.zip: reddit_data\.npz is missing key\(s\) \['label'\]"):
        read_dgl_reddit_zip(tmp_path / "reddit.zip", "reddit")


def test_drop_top_class_removes_its_nodes_and_edges(tmp_path):
    write_g2g(tmp_path / "cora.npz")
    graph = drop_classes(read_graph2gauss_npz(tmp_path / "cora.npz", "g"), [2])
    kept = np.array([0, 1, 3, 4, 6])  # nodes 2 and 5 had class 2: edges 1-2, 2-3, 4-5 go
    assert_graph(graph, FEATURES[kept], LABELS[kept], expected_dense()[np.ix_(kept, kept)])
    assert graph.adjacency.nnz == 4  # 0-1 and 0-6 remain
    both = drop_classes(read_graph2gauss_npz(tmp_path / "cora.npz", "g"), [2, 1])
    assert np.array_equal(both.labels, [0, 0]) and both.adjacency.nnz == 0


@pytest.mark.parametrize("classes", [[1], [0], [2, 0], [3]])
def test_drop_refuses_non_top_classes(tmp_path, classes):
    write_g2g(tmp_path / "cora.npz")
    with pytest.raises(ValueError, match="largest class ids"):
        drop_classes(read_graph2gauss_npz(tmp_path / "cora.npz", "g"), classes)


def test_save_load_roundtrip(tmp_path):
    write_g2g(tmp_path / "cora.npz")
    graph = read_graph2gauss_npz(tmp_path / "cora.npz", "corafull")
    save_graph(graph, tmp_path / "graph.out")  # written to exactly this path, no '.npz' appended
    loaded = load_graph(tmp_path / "graph.out")
    assert loaded.name == "corafull"
    assert_graph(loaded)
    assert np.array_equal(loaded.adjacency.indices, graph.adjacency.indices)


def test_read_source_unknown_format(tmp_path):
    with pytest.raises(ValueError, match=r"'planetoid'.*\['dgl_reddit_zip', 'graph2gauss_npz', 'ogb_zip'\]"):
        read_source("planetoid", tmp_path / "x", "x")
