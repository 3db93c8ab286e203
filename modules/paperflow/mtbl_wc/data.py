"""Multi-task data hyper-cleaning data (spec §4): images -> whitened features, seeded splits, label noise.

Smoke/tiny: scikit-learn's bundled `digits` (8x8). Paper: MNIST / FashionMNIST (28x28) from the
pinned downloads. The pipeline is the same: pixels scaled to [0, 1], centred and whitened on their
non-zero principal subspace (unsupervised, all images), optionally cut to `n_components`, plus
`zero_columns` all-zero columns and a bias column, so the LL design is rank-deficient (LLGC).
"""

from __future__ import annotations

from typing import Any

import numpy as np

RANK_RTOL = 1e-8


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(pixels in [0, 1] (N, 64), labels (N,)) from scikit-learn's bundled copy (no network)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data / 16.0, bunch.target.astype(np.int64)


def load_mnist_npz(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(pixels in [0, 1] (70000, 784), labels) from the Keras-format mnist.npz (train then test)."""
    with np.load(path) as raw:
        x = np.concatenate([raw["x_train"], raw["x_test"]]).reshape(-1, 784) / 255.0
        y = np.concatenate([raw["y_train"], raw["y_test"]]).astype(np.int64)
    return x, y


def whitened_features(pixels: np.ndarray, zero_columns: int, n_components: int | None) -> np.ndarray:
    """Centre, project on the non-zero principal directions (at most n_components), scale to unit
    variance, append `zero_columns` zero columns and a bias column of ones; `n_components` None keeps
    every non-zero direction."""
    centred = pixels - pixels.mean(0)
    _, sv, vt = np.linalg.svd(centred, full_matrices=False)
    rank = int(np.sum(sv > RANK_RTOL * sv[0]))
    if n_components is not None:
        rank = min(rank, n_components)
    feats = centred @ vt[:rank].T / (sv[:rank] / np.sqrt(len(pixels)))
    n = len(pixels)
    return np.hstack([feats, np.zeros((n, zero_columns)), np.ones((n, 1))])


def split_and_corrupt(labels: np.ndarray, spec: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Seeded permutation into train / val / test indices, and a uniformly random label for a
    `noise` fraction of the training samples (it may by chance equal the true label; `flipped`
    marks the ones that differ, the targets of corrupted-sample detection)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    n_tr, n_val = spec["n_train"], spec["n_val"]
    train, val, test = order[:n_tr], order[n_tr : n_tr + n_val], order[n_tr + n_val :]
    if spec["n_test"] is not None:
        test = test[: spec["n_test"]]
    noisy = labels[train].copy()
    corrupt = rng.random(n_tr) < spec["noise"]
    noisy[corrupt] = rng.integers(0, labels.max() + 1, size=int(corrupt.sum()))
    return {
        "train": train,
        "val": val,
        "test": test,
        "noisy_labels": noisy,
        "corrupted": corrupt,
        "flipped": noisy != labels[train],
    }


def task_masks(labels: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """(S, n) 0/1 membership of each sample in each task (a task = a group of classes)."""
    return np.stack([np.isin(labels, g) for g in groups]).astype(float)


def one_hot(labels: np.ndarray, k: int) -> np.ndarray:
    return np.eye(k)[labels]
