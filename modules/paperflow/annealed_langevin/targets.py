"""The Gaussian-mixture targets of the experiments and their exact ground-truth samples, stored as
Parquet: the mixture's parameters in the file's metadata, the samples as columns x0..x{d-1}."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from paperflow.annealed_langevin.gmm import GMM
from paperflow.core.io import read_array, write_array


def write_target(path: str | Path, gmm: GMM, n_gt: int, gt_seed: int) -> None:
    gt = gmm.sample(n_gt, np.random.default_rng(gt_seed))
    meta = {"means": gmm.means.tolist(), "stds": gmm.stds.tolist(), "weights": gmm.weights.tolist(), "gt_seed": gt_seed}
    write_array(path, gt, meta)


def read_target(path: str | Path) -> tuple[GMM, np.ndarray]:
    """(mixture, ground-truth samples) from a file written by write_target."""
    gt, meta = read_array(path)
    return GMM(np.asarray(meta["means"]), np.asarray(meta["stds"]), np.asarray(meta["weights"])), gt
