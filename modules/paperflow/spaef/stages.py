"""The file-level stages the workflow scripts call: each reads its inputs, calls the maths, writes outputs.
The embed stage is in embed.py, so that only the embed rule's env needs the language models."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.spaef.settings import known_keys

log = logging.getLogger(__name__)


def dense(m) -> np.ndarray:
    return np.asarray(m.toarray() if hasattr(m, "toarray") else m, dtype=np.float64)


# ---------------------------------------------------------------- graphs (§2.2.3-5, §2.3)


def graph_stats(adata: ad.AnnData, spot: np.ndarray, gene: np.ndarray) -> dict[str, float]:
    """Graph quality where truth is known: share of spot edges within one domain, of gene edges within
    one module, and how many decoy pairs survive."""
    stats: dict[str, float] = {"n_spot_edges": int(len(spot)), "n_gene_edges": int(len(gene))}
    if "domain" in adata.obs:
        d = adata.obs["domain"].to_numpy()
        stats["spot_edge_same_domain"] = float(np.mean(d[spot[:, 0]] == d[spot[:, 1]])) if len(spot) else float("nan")
    if "module" in adata.var:
        m = adata.var["module"].to_numpy()
        ok = (m[gene[:, 0]] >= 0) & (m[gene[:, 1]] >= 0) if len(gene) else np.zeros(0, bool)
        stats["gene_edge_same_module"] = float(np.mean(m[gene[ok, 0]] == m[gene[ok, 1]])) if ok.any() else float("nan")
    if "decoy_pairs" in adata.uns and len(gene):
        decoy = {tuple(sorted(map(int, p))) for p in np.asarray(adata.uns["decoy_pairs"])}
        kept = {tuple(sorted(map(int, p))) for p in gene}
        stats["decoy_pairs_kept"] = int(len(decoy & kept))
    return stats


def graphs_stage(
    proc: str,
    spots: str,
    genes: str,
    ggi: str,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    outs: Sequence[str],
    run_dir: str,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    *,
    engine: str,
    checkpoint_dir: str | Path | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    from paperflow.spaef import graphs as gr
    from paperflow.spaef.training import fit_spot_latent

    known_keys("graphs", cfg)
    known_keys("graphs.gene", cfg["gene"])
    adata = ad.read_h5ad(proc)
    x = dense(adata.X)
    spot_emb = read_frame(spots)[0].drop(columns="spot").to_numpy(np.float32)
    gframe = read_frame(genes)[0]
    emb_cols = [c for c in gframe.columns if c.startswith("e") and c[1:].isdigit()]
    index = {g: i for i, g in enumerate(gframe.gene)}
    matrix = gframe[gframe.in_matrix].set_index("gene").reindex(adata.var_names)
    gene_emb, has = matrix[emb_cols].to_numpy(np.float64), matrix["has_embedding"].to_numpy(bool)
    pairs = read_frame(ggi)[0]
    all_emb = gframe[emb_cols].to_numpy(np.float64)
    clf = gr.train_ggi(
        all_emb[pairs.a.map(index)], all_emb[pairs.b.map(index)], pairs.label.to_numpy(), cfg["ggi_seed"]
    )
    sc, gc = cfg["spot"], cfg["gene"]
    delaunay = gr.upper(np.column_stack(adata.obsp["spatial_connectivities"].nonzero()))
    ae_edges = delaunay if sc["directed_like_code"] else gr.symmetric(delaunay)
    candidates = gr.correlation_candidates(x, gc["k"], has)
    gene_lm, prob = gr.filter_pairs(candidates, gene_emb, clf, gc["threshold"])
    nolm_spot = gr.knn_edges(gr.cosine_topk(x, sc["k"]))
    finish = (lambda e: gr.upper(e)) if sc["directed_like_code"] else gr.symmetric
    histories, stats = (
        [],
        {
            "gene_candidates": int(len(candidates)),
            "ggi_train_accuracy": float(
                clf.score(all_emb[pairs.a.map(index)] + all_emb[pairs.b.map(index)], pairs.label.to_numpy())
            ),
        },
    )
    for seed, out in zip(seeds, outs):
        z, hist, track = fit_spot_latent(spot_emb, ae_edges, sc, seed, run_dir, wandb, tags, engine, checkpoint_dir)
        lm_spot = gr.knn_edges(gr.cosine_topk(z, sc["k"]))
        sets = {
            "spot_lm": finish(lm_spot),
            "spot_nolm": finish(nolm_spot),
            "gene_lm": gr.symmetric(gene_lm) if len(gene_lm) else gene_lm,
            "gene_nolm": gr.symmetric(candidates),
            "spot_delaunay": gr.symmetric(delaunay),
        }
        frame = pd.concat(
            [pd.DataFrame({"graph": k, "src": e[:, 0], "dst": e[:, 1]}) for k, e in sets.items()], ignore_index=True
        )
        quality = {f"{k}": graph_stats(adata, sets[f"spot_{k}"], sets[f"gene_{k}"]) for k in ("lm", "nolm")}
        stats[f"seed{seed}"] = quality | {"tracking": track}
        write_frame(out, frame, {"seed": seed, "quality": quality})
        histories.append(hist)
        log.info("seed %d graph quality %s", seed, quality)
    return pd.concat(histories), stats


def graph_edges(frame: pd.DataFrame, name: str) -> np.ndarray:
    """The (E, 2) edges of graph `name` in a graphs file's frame."""
    part = frame[frame.graph == name]
    return part[["src", "dst"]].to_numpy(np.int64)


# ---------------------------------------------------------------- training (§2.4)


def train_stage(
    proc: str,
    graph: str,
    seed: int,
    outs: Mapping[str, str],
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    run_dir: str,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    checkpoint_dir: str | Path | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Train every method of `outs` ({method: denoised .h5ad path}) on one (sample, seed) graph file, one
    after the other in this process, each from the same seed (so the order does not matter). `checkpoint_dir`:
    the job's (Lightning engine), where each method's fit checkpoints and resumes."""
    from paperflow.spaef.settings import METHODS
    from paperflow.spaef.training import fit_denoiser

    adata = ad.read_h5ad(proc)
    x = dense(adata.X)
    graphs, _ = read_frame(graph)  # once for every method
    histories, tracking = [], {}
    for method, out in outs.items():
        spec = METHODS[method]
        fusion = "entry" if spec["fusion"] == "learned" and model["gate"] == "entry" else spec["fusion"]
        mu, w, hist, tracking[method] = fit_denoiser(
            x,
            graph_edges(graphs, f"spot_{spec['graphs']}"),
            graph_edges(graphs, f"gene_{spec['graphs']}"),
            model=model,
            train=train,
            fusion=fusion,
            seed=seed,
            run_dir=run_dir,
            name=f"{method}_seed{seed}",
            wandb=wandb,
            tags=tags | {"method": method},
            checkpoint_dir=checkpoint_dir,
        )
        result = ad.AnnData(X=mu.astype(np.float32), obs=adata.obs[[]].copy(), var=adata.var[[]].copy())
        result.obs["w"] = w.mean(1) if w.ndim == 2 else w
        result.uns["method"] = {"name": method, "seed": seed, "fusion": fusion, **tracking[method]}
        result.write_h5ad(out)
        histories.append(hist.assign(method=method))
    return pd.concat(histories), tracking


# ---------------------------------------------------------------- baselines and evaluation (§3, §8)


def baselines_stage(proc: str, names: Sequence[str], cfg: Mapping[str, Any], out: str) -> None:
    from paperflow.spaef.baselines import run_baselines

    adata = ad.read_h5ad(proc)
    result = ad.AnnData(
        X=np.zeros((adata.n_obs, adata.n_vars), np.float32), obs=adata.obs[[]].copy(), var=adata.var[[]].copy()
    )
    for name, value in run_baselines(
        dense(adata.X), adata.obsp["spatial_connectivities"], adata.obsm["spatial"], list(names), dict(cfg)
    ).items():
        result.layers[name] = value.astype(np.float32)
    result.write_h5ad(out)


def marker_genes(adata: ad.AnnData, n: int) -> np.ndarray:
    """Module genes where truth is known, else the n most variable genes."""
    if "module" in adata.var:
        return np.flatnonzero(adata.var["module"].to_numpy() >= 0)
    return np.argsort(-dense(adata.X).var(0))[:n]


def evaluate_stage(
    proc: str, denoised: Mapping[tuple[str, int], str], baselines: str, seeds: Sequence[int], cfg: Mapping[str, Any]
) -> pd.DataFrame:
    from paperflow.spaef.metrics import domain_scores, genewise_pcc, morans_i

    known_keys("evaluate", cfg)
    adata = ad.read_h5ad(proc)
    base = ad.read_h5ad(baselines)
    labels = adata.obs["domain"].to_numpy() if "domain" in adata.obs else None
    clean = dense(adata.layers["clean"]) if "clean" in adata.layers else None
    markers = marker_genes(adata, cfg["n_marker_genes"])
    w = adata.obsp["spatial_connectivities"]
    rows = []

    def score(method: str, seed: int, x: np.ndarray) -> None:
        values: dict[str, float] = {}
        if clean is not None:
            values["pcc"] = genewise_pcc(x, clean)
        if labels is not None:
            values |= domain_scores(x, labels, cfg["n_pcs"], seed, cfg["gmm_starts"])
        values["morans_i"] = float(np.nanmean(morans_i(x[:, markers], w)))
        rows.extend({"method": method, "seed": seed, "metric": k, "value": v} for k, v in values.items())

    for seed in seeds:
        if clean is not None:
            score("clean", seed, clean)
        for name in base.layers:
            score(name, seed, dense(base.layers[name]))
    for (method, seed), path in denoised.items():
        score(method, seed, dense(ad.read_h5ad(path).X))
    return pd.DataFrame(rows)
