"""The download stage: SynthSRT drawn from its seed (tiny/smoke), or a real 10x Visium section
fetched with pinned sha256s (paper scale), written as one raw-count `.h5ad`."""

from __future__ import annotations

import logging
import tarfile
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from paperflow.core.download import pinned_fetch
from paperflow.spaef.synth import generate

log = logging.getLogger(__name__)


def fetch_all(name: str, files: dict[str, dict[str, Any]], cache: str | Path) -> dict[str, Path]:
    """Every file of a real dataset or model, each verified against its checksum from the config or
    config/locks/spaef.json; an unpinned file stops the run naming `paperflow pin spaef` and the config key (a spec's
    `key`, else datasets.<name>.files.<key>.sha256)."""
    paths = {}
    for key, spec in files.items():
        dest = Path(cache) / name / Path(spec["url"]).name
        config_key = spec.get("key", f"datasets.{name}.files.{key}.sha256")
        paths[key] = pinned_fetch(spec["url"], dest, spec["sha256"], slug="spaef", key=config_key)
    return paths


def tissue_positions(spatial_tar: Path) -> pd.DataFrame:
    """Spot barcode -> (in_tissue, pixel row, pixel col) from a spaceranger `spatial.tar.gz`."""
    with tarfile.open(spatial_tar) as tar:
        member = next(
            m for m in tar.getmembers() if Path(m.name).name in ("tissue_positions_list.csv", "tissue_positions.csv")
        )
        raw = tar.extractfile(member).read().decode()
    header = 0 if raw.startswith("barcode") else None
    from io import StringIO

    frame = pd.read_csv(StringIO(raw), header=header)
    frame.columns = ["barcode", "in_tissue", "array_row", "array_col", "pxl_row", "pxl_col"]
    return frame.set_index("barcode")


def read_visium(name: str, paths: dict[str, Path]) -> ad.AnnData:
    """10x filtered matrix + spot positions (+ optional domain labels, CSV barcode,label; NA rows dropped)."""
    import scanpy as sc  # imported on demand: only real data needs it, and it costs seconds per job

    adata = sc.read_10x_h5(paths["matrix"])
    adata.var_names_make_unique()
    pos = tissue_positions(paths["spatial"]).reindex(adata.obs_names)
    if pos.isna().any().any():
        raise ValueError(f"{name}: {int(pos.isna().any(axis=1).sum())} barcodes of the matrix have no tissue position")
    adata.obsm["spatial"] = pos[["pxl_col", "pxl_row"]].to_numpy(float)
    if "labels" in paths:
        labels = pd.read_csv(paths["labels"], index_col=0).iloc[:, 0].reindex(adata.obs_names)
        adata = adata[labels.notna().to_numpy()].copy()
        adata.obs["domain"] = pd.Categorical(labels.dropna().astype(str))
    if "housekeeping" in paths:
        hk = set(pd.read_csv(paths["housekeeping"]).iloc[:, 0].astype(str))
        adata.var["housekeeping"] = adata.var_names.isin(hk)
    return adata


def acquire(name: str, spec: dict[str, Any], seed: int, cache: str | Path) -> ad.AnnData:
    if spec["kind"] == "synthetic":
        adata = generate(spec, seed)
        log.info(
            "SynthSRT %s seed %d: %d spots x %d genes, %.1f%% zeros",
            name,
            seed,
            adata.n_obs,
            adata.n_vars,
            100 * (1 - adata.X.nnz / np.prod(adata.shape)),
        )
        return adata
    adata = read_visium(name, fetch_all(name, spec["files"], cache))
    adata.uns["source"] = {k: dict(v) for k, v in spec["files"].items()}
    return adata


def download(name: str, spec: dict[str, Any], seed: int, cache: str | Path, out: str | Path) -> None:
    acquire(name, spec, seed, cache).write_h5ad(out)
