"""Spec §2.1 preprocessing (scanpy), the Delaunay spot graph (squidpy) and the spot gene sentences (§2.2.1)."""

from __future__ import annotations

import logging

import anndata as ad
import numpy as np
import pandas as pd
import scanpy as sc
import squidpy as sq
from scipy import sparse

log = logging.getLogger(__name__)


def filter_counts(adata: ad.AnnData, gene_frac: float, spot_frac: float) -> ad.AnnData:
    """Keep genes non-zero in >= max(1, int(gene_frac * n_spots)) spots, then spots non-zero in
    >= max(1, int(spot_frac * n_genes)) of the kept genes (the official thresholds)."""
    adata = adata.copy()
    sc.pp.filter_genes(adata, min_cells=max(1, int(gene_frac * adata.n_obs)))
    sc.pp.filter_cells(adata, min_genes=max(1, int(spot_frac * adata.n_vars)))
    return adata


def cpm_log1p(counts: np.ndarray) -> np.ndarray:
    """log1p(x / rowsum * 1e6), written out (the tests compare it with scanpy's)."""
    counts = np.asarray(counts, dtype=np.float64)
    return np.log1p(counts / counts.sum(1, keepdims=True) * 1e6)


def normalise(adata: ad.AnnData) -> ad.AnnData:
    """layers['counts'] keeps the filtered counts; X becomes dense log1p-CPM (scanpy)."""
    adata.layers["counts"] = adata.X.copy()
    sc.pp.normalize_total(adata, target_sum=1e6)
    sc.pp.log1p(adata)
    adata.X = np.asarray(adata.X.toarray() if sparse.issparse(adata.X) else adata.X, dtype=np.float32)
    return adata


def delaunay_graph(adata: ad.AnnData) -> None:
    """obsp['spatial_connectivities'] = the Delaunay triangulation's edges (squidpy, generic coords)."""
    sq.gr.spatial_neighbors(adata, coord_type="generic", delaunay=True)


def gene_sentences(x: np.ndarray, genes: list[str], housekeeping: set[str], length: int) -> list[str]:
    """Per spot, the `length` most expressed genes in descending order, joined by spaces; symbols
    with '.' or '-' and housekeeping genes are dropped first (Loki's generate_gene_df). Ties break
    by gene order (a stable sort), so a constant factor on a spot never changes its sentence."""
    keep = np.array([("." not in g and "-" not in g and g not in housekeeping) for g in genes])
    names = np.asarray(genes)[keep]
    sub = np.asarray(x)[:, keep]
    order = np.argsort(-sub, axis=1, kind="stable")[:, :length]
    return [" ".join(names[row[sub[i, row] > 0]]) for i, row in enumerate(order)]


def preprocess(
    raw: ad.AnnData, gene_frac: float, spot_frac: float, sentence_length: int
) -> tuple[ad.AnnData, pd.DataFrame]:
    adata = normalise(filter_counts(raw, gene_frac, spot_frac))
    if "clean" in adata.layers:
        adata.layers["clean"] = np.asarray(adata.layers["clean"], dtype=np.float32)
    delaunay_graph(adata)
    housekeeping = (
        set(adata.var_names[adata.var["housekeeping"].to_numpy(bool)]) if "housekeeping" in adata.var else set()
    )
    counts = adata.layers["counts"]
    counts = counts.toarray() if sparse.issparse(counts) else np.asarray(counts)
    sentences = pd.DataFrame(
        {
            "spot": adata.obs_names,
            "sentence": gene_sentences(counts, list(adata.var_names), housekeeping, sentence_length),
        }
    )
    log.info(
        "preprocessed: %d spots x %d genes kept of %d x %d; %d Delaunay edges",
        adata.n_obs,
        adata.n_vars,
        raw.n_obs,
        raw.n_vars,
        adata.obsp["spatial_connectivities"].nnz // 2,
    )
    return adata, sentences
