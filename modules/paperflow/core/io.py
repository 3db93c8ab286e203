"""Arrays and tables on disk: Parquet with a JSON metadata dict carried in the file itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

META_KEY = b"paperflow"


def write_frame(path: str | Path, frame: pd.DataFrame, meta: dict[str, Any] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    schema_meta = dict(table.schema.metadata or {})
    schema_meta[META_KEY] = json.dumps(meta or {}).encode()
    pq.write_table(table.replace_schema_metadata(schema_meta), path)
    return path


def read_frame(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(META_KEY, b"{}")
    return table.to_pandas(), json.loads(raw)


def write_array(path: str | Path, x: np.ndarray, meta: dict[str, Any] | None = None) -> Path:
    """A 2-D float array as columns x0..x{D-1}."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array, got shape {x.shape}")
    return write_frame(path, pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])]), meta)


def read_array(path: str | Path) -> tuple[np.ndarray, dict[str, Any]]:
    frame, meta = read_frame(path)
    return frame.to_numpy(dtype=np.float64), meta
