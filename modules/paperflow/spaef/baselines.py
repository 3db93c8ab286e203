"""Baselines (spec §3). In-project: raw log1p-CPM, neighbour smoothing on the Delaunay graph and a
MAGIC-style diffusion on an expression kNN graph. Published denoisers, run through their own
packages on the same log1p-CPM input: MAGIC (`magic-impute`) and GraphST's reconstruction (`graphst`)."""

from __future__ import annotations

import numpy as np
from scipy import sparse
from sklearn.decomposition import PCA
from sklearn.neighbors import NearestNeighbors

from paperflow.spaef.settings import known_keys


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
    w = np.exp(-((dist / sigma[:, None]) ** 2))
    kernel = sparse.csr_matrix((w.ravel(), (np.repeat(np.arange(n), k + 1), idx.ravel())), shape=(n, n))
    kernel = kernel + kernel.T
    p = sparse.diags(1.0 / np.asarray(kernel.sum(1)).ravel()) @ kernel
    out = x.astype(np.float64)
    for _ in range(t):
        out = p @ out
    return out


def magic_impute(x: np.ndarray, knn: int, decay: float, t: int, n_pca: int, seed: int) -> np.ndarray:
    """MAGIC (van Dijk et al., Cell 2018) by its published package: `magic.MAGIC` with the exact solver,
    i.e. P^t X in gene space, P the package's alpha-decay kNN diffusion operator (graphtools) on X's
    n_pca principal components (no PCA when n_pca >= min(X.shape), the package's rule)."""
    import magic as magic_pkg

    op = magic_pkg.MAGIC(knn=knn, decay=decay, t=t, n_pca=n_pca, solver="exact", random_state=seed, n_jobs=1, verbose=0)
    return np.asarray(op.fit_transform(np.asarray(x, dtype=np.float64), genes="all_genes"), dtype=np.float64)


def graphst_reconstruction(
    x: np.ndarray, coords: np.ndarray, epochs: int, lr: float, dim_output: int, alpha: float, beta: float, seed: int
) -> np.ndarray:
    """GraphST's reconstructed expression (Long et al., Nat Commun 2023) by its published package: the
    decoder output `emb` of its graph self-supervised contrastive autoencoder, trained on its own
    3-nearest-neighbour spatial graph of `coords` (10x Visium mode, CPU). GraphST's preprocessing ends
    with `sc.pp.scale(zero_center=False, max_value=10)`; we apply that step to x (every gene kept, no
    HVG selection) and multiply the reconstruction back by each gene's std, so it is on x's scale."""
    import anndata as ad
    import scanpy as sc
    import torch
    from GraphST.GraphST import GraphST

    adata = ad.AnnData(X=np.asarray(x, dtype=np.float32), obsm={"spatial": np.asarray(coords, dtype=np.float64)})
    sc.pp.scale(adata, zero_center=False, max_value=10)
    adata.var["highly_variable"] = True  # every gene is a feature; GraphST then skips its own preprocessing
    model = GraphST(
        adata,
        device=torch.device("cpu"),
        learning_rate=lr,
        epochs=epochs,
        dim_output=dim_output,
        alpha=alpha,
        beta=beta,
        random_seed=seed,
        datatype="10X",
    )
    emb = np.asarray(model.train().obsm["emb"], dtype=np.float64)
    return emb * adata.var["std"].to_numpy(np.float64)[None, :]


def run_baselines(
    x: np.ndarray, adjacency: sparse.spmatrix, coords: np.ndarray, names: list[str], cfg: dict
) -> dict[str, np.ndarray]:
    known_keys("baseline", cfg)
    impl = {
        "raw": lambda: np.asarray(x, dtype=np.float64),
        "delaunay_smooth": lambda: delaunay_smooth(x, adjacency, cfg["smooth_alpha"]),
        "magic": lambda: magic(x, cfg["magic_k"], cfg["magic_t"], cfg["magic_pcs"]),
        "magic_impute": lambda: magic_impute(x, **cfg["magic_impute"], seed=cfg["seed"]),
        "graphst": lambda: graphst_reconstruction(x, coords, **cfg["graphst"], seed=cfg["seed"]),
    }
    return {name: impl[name]() for name in names}
