"""The download and preprocess stages of the synthetic and bundled datasets (no torch, no network).

At every scale the uncertain least-squares, circle, two-moons and digits sets come from seeded
generators or scikit-learn's bundled data, inside the download stage, so the DAG has one shape.
The CIFAR-10 feature set has its own stages (`paperflow.dro_flow.features`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.dro_flow.data import make_dataset, standardize

log = logging.getLogger(__name__)


def download(name: str, kind: str, spec: dict[str, Any], seed: int, out: str | Path) -> None:
    data, meta = make_dataset({"kind": kind, **spec}, seed)
    write_frame(out, data, {"dataset": name, "kind": kind, "spec": spec, "seed": seed, **meta})
    log.info("generated %s (%s): %s", name, kind, data.split.value_counts().to_dict())


def features_of(data: pd.DataFrame) -> list[str]:
    return [c for c in data.columns if c.startswith("x")]


def preprocess(raw: str | Path, train_out: str | Path, test_out: str | Path, scale_features: bool) -> None:
    """Split on the `split` column; optionally standardise the features by the training statistics."""
    data, meta = read_frame(raw)
    cols = features_of(data)
    if not np.isfinite(data[cols].to_numpy()).all():
        raise ValueError(f"{raw}: non-finite feature values")
    train, test = data[data.split == "train"].reset_index(drop=True), data[data.split == "test"].reset_index(drop=True)
    if scale_features:
        xs_tr, xs_te = standardize(train[cols].to_numpy(), test[cols].to_numpy())
        train[cols], test[cols] = xs_tr, xs_te
    meta = meta | {"standardized": scale_features}
    write_frame(train_out, train.drop(columns="split"), meta | {"part": "train"})
    write_frame(test_out, test.drop(columns="split"), meta | {"part": "test"})
    log.info("split %s: %d train / %d test rows", raw, len(train), len(test))
