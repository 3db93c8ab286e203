"""The data stages: acquire a dataset (bundled digits, or a checksummed download), split it into
train/test Parquet files, and draw each seed's client partition."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.download import pinned_fetch
from paperflow.core.io import read_frame, write_frame
from paperflow.decfus.data import (
    CLASSES,
    NORMALISATION,
    load_digits_frame,
    make_partition,
    read_cifar_binary,
    read_svhn_mat,
    stratified_split,
    to_frame,
)

log = logging.getLogger(__name__)

CIFAR10_TRAIN = [f"data_batch_{i}.bin" for i in range(1, 6)]


def _fetch(name: str, key: str, spec: Mapping[str, Any], cache: Path) -> Path:
    url, sha = spec[f"{key}url"], spec[f"{key}sha256"]
    return pinned_fetch(url, cache / Path(url).name, sha, slug="decfus", key=f"datasets.{name}.{key}sha256")


def acquire(name: str, spec: Mapping[str, Any], cache_dir: str | Path) -> pd.DataFrame:
    """All images of one dataset as a frame (label, pixels[, split])."""
    cache = Path(cache_dir)
    kind = spec["kind"]
    if kind == "digits":
        return load_digits_frame()
    if kind == "cifar10":
        path = _fetch(name, "", spec, cache)
        return pd.concat(
            [
                to_frame(*read_cifar_binary(path, CIFAR10_TRAIN, 1, 0), "train"),
                to_frame(*read_cifar_binary(path, ["test_batch.bin"], 1, 0), "test"),
            ],
            ignore_index=True,
        )
    if kind == "cifar100":
        path = _fetch(name, "", spec, cache)  # records: coarse label, fine label, pixels
        return pd.concat(
            [
                to_frame(*read_cifar_binary(path, ["train.bin"], 2, 0), "train"),
                to_frame(*read_cifar_binary(path, ["test.bin"], 2, 0), "test"),
            ],
            ignore_index=True,
        )
    if kind == "svhn":
        return pd.concat(
            [
                to_frame(*read_svhn_mat(_fetch(name, "train_", spec, cache)), "train"),
                to_frame(*read_svhn_mat(_fetch(name, "test_", spec, cache)), "test"),
            ],
            ignore_index=True,
        )
    raise ConfigError(f"datasets.{name}.kind = {kind!r} is not known; known: digits, cifar10, cifar100, svhn")


def download(name: str, spec: Mapping[str, Any], cache_dir: str | Path, out: str | Path) -> int:
    frame = acquire(name, spec, cache_dir)
    source = {k: v for k, v in spec.items() if k.endswith("url") or k.endswith("sha256")}
    write_frame(out, frame, {"dataset": name, "kind": spec["kind"], "source": source})
    log.info("%s: %d images", name, len(frame))
    return len(frame)


def preprocess(raw: str | Path, spec: Mapping[str, Any], train_out: str | Path, test_out: str | Path) -> dict[str, int]:
    """The official train/test split where the dataset has one; a stratified split otherwise."""
    frame, meta = read_frame(raw)
    kind = spec["kind"]
    if "split" in frame:
        test = frame["split"].to_numpy() == "test"
        frame = frame.drop(columns="split")
    else:
        test = stratified_split(frame["label"].to_numpy(), spec["test_fraction"], spec["split_seed"])
    meta = meta | {"normalisation": NORMALISATION[kind], "classes": CLASSES[kind]}
    write_frame(train_out, frame[~test].reset_index(drop=True), meta | {"part": "train"})
    write_frame(test_out, frame[test].reset_index(drop=True), meta | {"part": "test"})
    sizes = {"train": int((~test).sum()), "test": int(test.sum())}
    log.info("split %s: %s", raw, sizes)
    return sizes


def partition(train: str | Path, clients: int, spec: Mapping[str, Any], seed: int, out: str | Path) -> list[int]:
    """Client index lists (rows of the train file) as JSON; returns the client sizes."""
    frame, _ = read_frame(train)
    labels = frame["label"].to_numpy()
    parts = make_partition(labels, clients, spec, seed)
    doc = {
        "spec": dict(spec),
        "seed": seed,
        "clients": [p.tolist() for p in parts],
        "label_counts": [np.bincount(labels[p], minlength=int(labels.max()) + 1).tolist() for p in parts],
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc))
    return [len(p) for p in parts]


def read_partition(path: str | Path) -> list[np.ndarray]:
    return [np.asarray(p, dtype=np.int64) for p in json.loads(Path(path).read_text())["clients"]]
