"""Long-frame helpers shared by the papers' reports: mean/std/n over seeds.

A long frame has one row per measurement: label columns (method, dataset, metric, ...), a `seed`
column and a value column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd


def select(frame: pd.DataFrame, **where: Any) -> pd.DataFrame:
    """The rows whose columns equal the given values; an unknown column raises."""
    unknown = [c for c in where if c not in frame.columns]
    if unknown:
        raise KeyError(f"no column(s) {unknown} in frame; columns are {list(frame.columns)}")
    mask = np.ones(len(frame), dtype=bool)
    for column, value in where.items():
        mask &= (frame[column] == value).to_numpy()
    return frame[mask]


def seed_summary(frame: pd.DataFrame, by: Sequence[str], value: str = "value", dropna: bool = True) -> pd.DataFrame:
    """Mean, std (ddof 1) and number of seeds of `value` per group of `by`, sorted by `by`; with
    `dropna=False` a NaN label (e.g. a metric over all preferences) is a group of its own, sorted last."""
    grouped = frame.groupby(list(by), dropna=dropna)[value]
    return grouped.agg(mean="mean", std="std", n_seeds="count").reset_index()
