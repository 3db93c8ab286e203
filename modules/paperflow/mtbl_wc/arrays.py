"""Arrays of different shapes (instances, splits, iterates) in one `.npz` file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def save_npz(path: str | Path, **arrays: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    with np.load(path) as raw:
        return {k: raw[k] for k in raw.files}
