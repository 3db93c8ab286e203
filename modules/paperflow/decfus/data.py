"""Datasets as (uint8 pixels, labels) and the client partitions (spec §4).

Smoke: scikit-learn's bundled digits (8×8, values 0..16). Paper: CIFAR-10 / CIFAR-100 (binary
versions; CIFAR-100 with its 20 coarse labels, as the official code) and SVHN (.mat files).
Pixels stay uint8 on disk; `normalise` maps them to the network's input with the official
per-dataset mean/std.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# (mean, std) per channel after scaling to [0, 1] (spec §4); digits: scale only
NORMALISATION = {
    "digits": {"scale": 16.0, "mean": [0.0], "std": [1.0], "shape": [64]},
    "cifar10": {"scale": 255.0, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "shape": [3, 32, 32]},
    "cifar100": {
        "scale": 255.0,
        "mean": [0.4914, 0.4822, 0.4465],
        "std": [0.2023, 0.1994, 0.2010],
        "shape": [3, 32, 32],
    },
    "svhn": {"scale": 255.0, "mean": [0.4377, 0.4438, 0.4728], "std": [0.1980, 0.2010, 0.1970], "shape": [3, 32, 32]},
}
CLASSES = {"digits": 10, "cifar10": 10, "cifar100": 20, "svhn": 10}


def to_frame(pixels: np.ndarray, labels: np.ndarray, split: str | None = None) -> pd.DataFrame:
    """One row per image: label, and the pixels as bytes (channel-major)."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(len(labels), -1)
    frame = pd.DataFrame({"label": np.asarray(labels, dtype=np.int64), "pixels": [row.tobytes() for row in pixels]})
    if split is not None:
        frame["split"] = split
    return frame


def from_frame(frame: pd.DataFrame, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 pixels of shape (n, *shape), int64 labels)."""
    flat = np.frombuffer(b"".join(frame["pixels"]), dtype=np.uint8).reshape(len(frame), -1)
    return flat.reshape(len(frame), *shape), frame["label"].to_numpy(np.int64)


def normalise(pixels: np.ndarray, norm: Mapping[str, Any]) -> np.ndarray:
    x = pixels.astype(np.float32) / np.float32(norm["scale"])
    if x.ndim == 4:
        mean = np.asarray(norm["mean"], np.float32)[None, :, None, None]
        std = np.asarray(norm["std"], np.float32)[None, :, None, None]
        x = (x - mean) / std
    return x


def load_digits_frame() -> pd.DataFrame:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return to_frame(x.astype(np.uint8), y)


def read_cifar_binary(
    archive: str | Path, members: Sequence[str], label_bytes: int, label_index: int
) -> tuple[np.ndarray, np.ndarray]:
    """Records of `label_bytes` label bytes + 3072 pixel bytes (CIFAR-100: coarse, fine)."""
    chunks = []
    with tarfile.open(archive, "r:gz") as tar:
        names = {Path(m.name).name: m for m in tar.getmembers()}
        for member in members:
            chunks.append(np.frombuffer(tar.extractfile(names[member]).read(), dtype=np.uint8))
    rec = np.concatenate(chunks).reshape(-1, label_bytes + 3072)
    return rec[:, label_bytes:].reshape(-1, 3, 32, 32), rec[:, label_index].astype(np.int64)


def read_svhn_mat(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN's cropped-digit .mat: X (32, 32, 3, n), y (n, 1) with 10 meaning digit 0."""
    from scipy.io import loadmat

    mat = loadmat(io.BytesIO(Path(path).read_bytes()))
    pixels = np.transpose(mat["X"], (3, 2, 0, 1))
    labels = mat["y"].reshape(-1).astype(np.int64) % 10
    return pixels, labels


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """Boolean test mask with the class proportions kept (digits has no official split)."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    _, test = train_test_split(idx, test_size=test_fraction, stratify=labels, random_state=seed)
    mask = np.zeros(len(labels), dtype=bool)
    mask[test] = True
    return mask


def iid_partition(n: int, m: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal random shares of int(n / m) samples (the remainder is unused, as in the code)."""
    perm = rng.permutation(n)
    size = n // m
    return [np.sort(perm[i * size : (i + 1) * size]) for i in range(m)]


def dirichlet_partition(
    labels: np.ndarray, m: int, beta: float, rng: np.random.Generator, min_size: int = 10
) -> list[np.ndarray]:
    """Per-class Dirichlet(β) shares over clients; clients already above n/m get no more of the
    next classes; redrawn until every client has at least `min_size` samples (noniid_case 5)."""
    n, classes = len(labels), np.unique(labels)
    while True:
        parts: list[list[int]] = [[] for _ in range(m)]
        for k in classes:
            idx = rng.permutation(np.flatnonzero(labels == k))
            p = rng.dirichlet(np.full(m, beta))
            p = p * np.array([len(part) < n / m for part in parts])
            cuts = (np.cumsum(p / p.sum()) * len(idx)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx, cuts)):
                part.extend(chunk.tolist())
        if min(len(part) for part in parts) >= min_size:
            return [np.sort(np.asarray(part, dtype=np.int64)) for part in parts]


def make_partition(labels: np.ndarray, m: int, spec: Mapping[str, Any], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if spec["kind"] == "iid":
        return iid_partition(len(labels), m, rng)
    if spec["kind"] == "dirichlet":
        return dirichlet_partition(labels, m, float(spec["beta"]), rng)
    raise ValueError(f"unknown partition kind {spec['kind']!r}; known: iid, dirichlet")
