"""lozo_plus's download and preprocess stages at smoke and tiny scale (numpy and pandas only: these jobs start
without torch): the task is generated, so "download" writes its splits as raw text rows. Paper scale has its own
download and preprocess rules (`paperflow.lozo_plus.paper`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame, write_frame
from paperflow.lozo_plus import task as tk


def download(source: Mapping[str, Any], data: Mapping[str, Any], out: str) -> pd.DataFrame:
    """Smoke/tiny: the generated task as raw text rows (split, text, label word). Paper scale (source.kind
    superglue) is downloaded by `paperflow.lozo_plus.paper`, never here."""
    if source["kind"] != "synthetic":
        raise ConfigError(
            f"lozo_plus source.kind {source['kind']!r}: this stage generates the synthetic task only; the paper "
            "scale's downloads are paperflow.lozo_plus.paper.download_model / download_task (workflows/lozo_plus/paper.smk)"
        )
    sizes = {k: int(data[k]) for k in tk.SPLITS}
    splits = tk.make_splits(sizes, int(data["seed"]), int(data["length"]))
    frame = pd.concat(
        [
            pd.DataFrame({"split": name, "text": tk.to_words(ids), "label": np.where(y == 1, "YES", "NO")})
            for name, (ids, y) in splits.items()
        ],
        ignore_index=True,
    )
    write_frame(out, frame, {"generator": "paperflow.lozo_plus.task.make_splits", **dict(data)})
    return frame


def preprocess(raw: str, outputs: Mapping[str, str]) -> dict[str, int]:
    """The template (BOS, content, SEP) and the label index of every split, each label checked against the rule
    of its task (a corrupted or mislabelled raw file is refused)."""
    frame, meta = read_frame(raw)
    counts = {}
    for split, path in outputs.items():
        rows = frame[frame["split"] == split]
        ids = tk.from_words(rows["text"].tolist())
        labels = (rows["label"].to_numpy() == "YES").astype(np.int64)
        wrong = int((tk.label_of(tk.SPLITS[split], ids) != labels).sum())
        if wrong:
            raise ValueError(f"{raw}: {wrong} rows of split {split!r} carry a label their task does not give")
        write_frame(path, pd.DataFrame({"ids": list(ids), "label": labels}), {"split": split, "task": tk.SPLITS[split]})
        counts[split] = len(labels)
    return counts
