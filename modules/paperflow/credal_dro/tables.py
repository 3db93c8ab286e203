"""The long split table: columns seed, part, optional u / label / group, and features x0..x{D-1}."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from paperflow.core.io import read_frame


def load_splits(path: str | Path) -> dict[int, dict[str, pd.DataFrame]]:
    frame, _ = read_frame(path)
    return {
        int(s): {p: g.drop(columns=["seed", "part"]).reset_index(drop=True) for p, g in fs.groupby("part")}
        for s, fs in frame.groupby("seed")
    }


def features(part: pd.DataFrame) -> np.ndarray:
    return part[[c for c in part.columns if c.startswith("x")]].to_numpy(dtype=float)
