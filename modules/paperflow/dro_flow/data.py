"""Seeded generators of dro_flow's datasets (numpy + scikit-learn; no torch).

Every generator returns a frame with feature columns x0..x{d-1}, an integer label `y` (0 for the
regression problem) and `split` ('train' or 'test'), plus a metadata dict. Spec section 4.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

SQRT2 = float(np.sqrt(2.0))


def frame(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> pd.DataFrame:
    x = np.vstack([x_train, x_test]).astype(np.float64)
    out = pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])])
    out["y"] = np.concatenate([y_train, y_test]).astype(np.int64)
    out["split"] = ["train"] * len(x_train) + ["test"] * len(x_test)
    return out


def uls_matrices(dim: int, matrix_seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.RandomState]:
    """A0, A1, b of the uncertain least-squares problem, drawn as the official script does: legacy
    `np.random.seed(matrix_seed)` and `randn` in the order A0, A1, b (App. D.2). Also returns the
    stream, positioned after b."""
    rs = np.random.RandomState(matrix_seed)
    a0 = rs.randn(dim, dim)
    a1 = rs.randn(dim, dim)
    b = rs.randn(dim)
    return a0, a1, b, rs


def uncertain_least_squares(spec: dict[str, Any], seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Train xi ~ U[-0.5, 0.5] (n_train) and a test base u ~ U[-0.5, 0.5] (n_test); the test set at
    perturbation Delta is (1 + Delta) * u. With stream 'official' the training xi continue the legacy
    stream after b, exactly as the official script draws them."""
    a0, a1, b, rs = uls_matrices(spec["dim"], spec["matrix_seed"])
    if spec["stream"] == "official":
        xi_train = rs.uniform(-0.5, 0.5, spec["n_train"])
        u_test = np.random.default_rng(seed).uniform(-0.5, 0.5, spec["n_test"])
    else:
        rng = np.random.default_rng(seed)
        xi_train = rng.uniform(-0.5, 0.5, spec["n_train"])
        u_test = rng.uniform(-0.5, 0.5, spec["n_test"])
    out = frame(xi_train[:, None], np.zeros(len(xi_train)), u_test[:, None], np.zeros(len(u_test)))
    return out, {"A0": a0.tolist(), "A1": a1.tolist(), "b": b.tolist()}


def circle_points(rng: np.random.Generator, n: int, drop_first_quadrant: bool) -> tuple[np.ndarray, np.ndarray]:
    """x ~ N(0, I_2), y = 1[||x|| > sqrt 2], the band sqrt2/1.3 < ||x|| < 1.3 sqrt2 removed (Sec. 6.1)."""
    kept_x, kept_y, have = [], [], 0
    while have < n:
        x = rng.standard_normal((4 * n, 2))
        r = np.linalg.norm(x, axis=1)
        keep = (r <= SQRT2 / 1.3) | (r >= 1.3 * SQRT2)
        if drop_first_quadrant:
            keep &= ~((x[:, 0] > 0) & (x[:, 1] > 0))
        kept_x.append(x[keep])
        kept_y.append((r[keep] > SQRT2).astype(np.int64))
        have += int(keep.sum())
    return np.vstack(kept_x)[:n], np.concatenate(kept_y)[:n]


def circle(spec: dict[str, Any], seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Imbalanced circle: the training set has no first-quadrant points (the official code drops all
    of them), the test set keeps every quadrant."""
    rng = np.random.default_rng(seed)
    x_tr, y_tr = circle_points(rng, spec["n_train"], drop_first_quadrant=True)
    x_te, y_te = circle_points(rng, spec["n_test"], drop_first_quadrant=False)
    return frame(x_tr, y_tr, x_te, y_te), {}


def two_moons(spec: dict[str, Any], seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """scikit-learn's make_moons(noise); the training set keeps imbalance_ratio x as many class-1 as
    class-0 points, the test set is balanced (Sec. 6.2)."""
    from sklearn.datasets import make_moons

    n0 = int(round(spec["n_train"] / (1 + spec["imbalance_ratio"])))
    n1 = spec["n_train"] - n0
    pool = 4 * max(n0, spec["n_test"])
    x, y = make_moons(n_samples=2 * pool, noise=spec["noise"], random_state=seed)
    idx0, idx1 = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    train = np.concatenate([idx0[:n0], idx1[:n1]])
    half = spec["n_test"] // 2
    test = np.concatenate([idx0[n0 : n0 + half], idx1[n1 : n1 + spec["n_test"] - half]])
    return frame(x[train], y[train], x[test], y[test]), {}


def digits(spec: dict[str, Any], seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Offline stand-in for the CIFAR-10 features (spec section 4): scikit-learn's bundled 8x8 digits,
    stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=spec["test_fraction"], random_state=seed, stratify=y)
    return frame(x_tr, y_tr, x_te, y_te), {}


GENERATORS = {"uls": uncertain_least_squares, "circle": circle, "moons": two_moons, "digits": digits}


def make_dataset(spec: dict[str, Any], seed: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    return GENERATORS[spec["kind"]](spec, seed)


def standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale by the training mean and std (constant columns keep std 1)."""
    mean, std = train.mean(0), train.std(0)
    std = np.where(std > 0, std, 1.0)
    return (train - mean) / std, (test - mean) / std
