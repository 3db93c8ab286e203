"""Download (or generate) and preprocess ph_vae's datasets.

At tiny/smoke scale every dataset is drawn from its true law by a seeded generator (the paper's own
synthetic benchmark), inside the download stage, so the DAG has the same shape at every scale. At
paper scale the Danish fire-insurance losses are fetched with a pinned sha256.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from paperflow.core.config import ConfigError
from paperflow.core.download import fetch
from paperflow.core.io import read_array, write_array
from paperflow.ph_vae.data import empirical_truth, make_dataset, read_danish_csv, train_test_split

log = logging.getLogger(__name__)


def acquire(name: str, spec: dict[str, Any], seed: int, cache_dir: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    """The raw data of one dataset, (n, D), and its truth dict (the true law, or 'empirical')."""
    if spec["kind"] != "download":
        generator_spec = {k: v for k, v in spec.items() if k != "n"}
        x, truth = make_dataset(generator_spec, spec["n"], seed)
        log.info("generated %s: %d rows x %d dims from %s", name, *x.shape, spec)
        return x, truth
    if not spec.get("sha256"):
        raise ConfigError(
            f"datasets.{name}.sha256 is not set for {spec['url']}: paperflow never downloads unpinned data. "
            f"Fetch the file once on a machine with network, run `sha256sum` on it, and set the value in config/ph_vae.yaml"
        )
    path = fetch(spec["url"], Path(cache_dir) / Path(spec["url"]).name, spec["sha256"])
    x = read_danish_csv(path)[:, None]
    truth = empirical_truth(name, dim=1) | {"source": {"url": spec["url"], "sha256": spec["sha256"]}}
    log.info("downloaded %s: %d rows from %s", name, len(x), spec["url"])
    return x, truth


def download(name: str, spec: dict[str, Any], seed: int, cache_dir: str | Path, out: str | Path) -> None:
    x, truth = acquire(name, spec, seed, cache_dir)
    write_array(out, x, {"dataset": name, "truth": truth})


def preprocess(
    raw: str | Path, train_out: str | Path, test_out: str | Path, test_fraction: float, seed: int, rescale: float | None
) -> None:
    """Positivity check, rescaling (downloaded data only: `rescale` is None for synthetic sets), seeded
    train/test split."""
    x, meta = read_array(raw)
    if not np.isfinite(x).all() or (x <= 0).any():
        bad = int((~np.isfinite(x) | (x <= 0)).sum())
        raise ValueError(f"{raw}: {bad} value(s) are not finite and positive; PH-VAE models positive data only")
    if rescale is not None:
        if meta["truth"]["synthetic"]:
            raise ConfigError(f"{raw}: rescale = {rescale} would break the true law of a synthetic dataset; remove it")
        x = x * rescale
    train, test = train_test_split(x, test_fraction, seed)
    meta = meta | {"rescale": rescale, "split": {"test_fraction": test_fraction, "seed": seed}}
    write_array(train_out, train, meta | {"part": "train"})
    write_array(test_out, test, meta | {"part": "test"})
    log.info("split %s: %d train / %d test rows", raw, len(train), len(test))
