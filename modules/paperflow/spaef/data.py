"""The download stage: SynthSRT drawn from its seed (tiny/smoke), or a real 10x Visium section
fetched with pinned sha256s (paper scale), written as one raw-count `.h5ad`."""

from __future__ import annotations

import logging
import tarfile
from io import StringIO
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


def tissue_positions(path: Path) -> pd.DataFrame:
    """Spot barcode -> (in_tissue, array and pixel positions) from a spaceranger `spatial.tar.gz` (its
    tissue_positions_list.csv or tissue_positions.csv) or from that table on its own (HumanPilot keeps each DLPFC
    sample's as `10X/<sample>/tissue_positions_list.txt`); with or without spaceranger 2's header row."""
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            names = ("tissue_positions_list.csv", "tissue_positions.csv")
            member = next((m for m in tar.getmembers() if Path(m.name).name in names), None)
            if member is None:
                raise ValueError(f"{path}: the archive holds neither of {names}")
            raw = tar.extractfile(member).read().decode()
    else:
        raw = Path(path).read_text()
    header = 0 if raw.startswith("barcode") else None
    frame = pd.read_csv(StringIO(raw), header=header)
    if frame.shape[1] != 6:
        raise ValueError(f"{path}: a tissue positions table has 6 columns, this one {frame.shape[1]}")
    frame.columns = ["barcode", "in_tissue", "array_row", "array_col", "pxl_row", "pxl_col"]
    return frame.set_index("barcode")


def domain_labels(path: Path, sample: str | None = None) -> pd.Series:
    """Spot barcode -> domain label: a CSV `barcode,label` of one sample, or, with `sample`, the rows of that
    sample in a tab-separated `barcode, sample, label` table without header (HumanPilot's
    `10X/barcode_level_layer_map.tsv`, the manual layer annotation of all twelve DLPFC sections)."""
    if sample is None:
        return pd.read_csv(path, index_col=0).iloc[:, 0]
    frame = pd.read_csv(path, sep="\t", header=None, names=["barcode", "sample", "label"], dtype=str)
    rows = frame[frame["sample"] == str(sample)]
    if rows.empty:
        raise ValueError(f"{path}: no rows for sample {sample!r}; samples present: {sorted(frame['sample'].unique())}")
    return rows.set_index("barcode")["label"]


def read_visium(name: str, paths: dict[str, Path], labels_sample: str | None = None) -> ad.AnnData:
    """10x filtered matrix + spot positions (+ optional domain labels, see `domain_labels`; spots without a
    label dropped)."""
    import scanpy as sc  # imported on demand: only real data needs it, and it costs seconds per job

    adata = sc.read_10x_h5(paths["matrix"])
    adata.var_names_make_unique()
    pos = tissue_positions(paths["spatial"]).reindex(adata.obs_names)
    if pos.isna().any().any():
        raise ValueError(f"{name}: {int(pos.isna().any(axis=1).sum())} barcodes of the matrix have no tissue position")
    adata.obsm["spatial"] = pos[["pxl_col", "pxl_row"]].to_numpy(float)
    if "labels" in paths:
        labels = domain_labels(paths["labels"], labels_sample).reindex(adata.obs_names)
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
    adata = read_visium(name, fetch_all(name, spec["files"], cache), spec["files"].get("labels", {}).get("sample"))
    adata.uns["source"] = {k: dict(v) for k, v in spec["files"].items()}
    return adata


def download(name: str, spec: dict[str, Any], seed: int, cache: str | Path, out: str | Path) -> None:
    acquire(name, spec, seed, cache).write_h5ad(out)
