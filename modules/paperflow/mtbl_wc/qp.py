"""Minimum-norm point of the convex hull of S vectors: min_{lam in simplex} lam^T M lam, M = G G^T.

Closed form for S = 2; a primal active-set method (exact on its support, Lawson-Hanson style) for
S > 2. Both work from the Gram matrix only, so a rank-deficient G (parallel gradients) is fine.
"""

from __future__ import annotations

import numpy as np


def min_norm_two(m: np.ndarray) -> np.ndarray:
    """Closed form for S = 2, batched: m is (..., 2, 2); returns lam (..., 2).

    lam_1 = clip((m22 - m12) / (m11 + m22 - 2 m12), 0, 1) (the projection of 0 on a segment)."""
    m11, m22, m12 = m[..., 0, 0], m[..., 1, 1], m[..., 0, 1]
    denom = m11 + m22 - 2.0 * m12
    safe = np.where(denom > 1e-300, denom, 1.0)
    lam1 = np.where(denom > 1e-300, np.clip((m22 - m12) / safe, 0.0, 1.0), 0.5)
    return np.stack([lam1, 1.0 - lam1], axis=-1)


def _solve_on_support(m: np.ndarray, support: np.ndarray) -> np.ndarray:
    """lam restricted to `support` minimising lam^T M lam with sum(lam) = 1 (KKT system, least squares)."""
    k = int(support.sum())
    sub = m[np.ix_(support, support)]
    kkt = np.block([[sub, np.ones((k, 1))], [np.ones((1, k)), np.zeros((1, 1))]])
    rhs = np.zeros(k + 1)
    rhs[-1] = 1.0
    sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    lam = np.zeros(len(m))
    lam[support] = sol[:k]
    return lam


def min_norm_active_set(m: np.ndarray, tol: float = 1e-12, max_iter: int = 200) -> np.ndarray:
    """Exact minimiser of lam^T M lam on the simplex for one PSD (S, S) matrix M."""
    s = len(m)
    scale = max(float(np.max(np.abs(np.diag(m)))), 1e-300)
    support = np.zeros(s, dtype=bool)
    support[int(np.argmin(np.diag(m)))] = True
    lam = support.astype(float)
    for _ in range(max_iter):
        trial = _solve_on_support(m, support)
        if np.all(trial[support] > 0.0):
            lam = trial
            grad = m @ lam
            value = float(lam @ grad)
            outside = np.where(~support)[0]
            if outside.size == 0 or np.min(grad[outside]) >= value - tol * scale:
                return lam
            support[outside[int(np.argmin(grad[outside]))]] = True
            continue
        # step from the feasible lam towards trial until the first weight reaches zero, drop it
        shrinking = support & (trial <= 0.0)
        ratios = lam[shrinking] / np.maximum(lam[shrinking] - trial[shrinking], 1e-300)
        step = float(np.min(ratios))
        lam = lam + step * (trial - lam)
        support &= lam > tol
        lam = np.where(support, np.maximum(lam, 0.0), 0.0)
        lam /= lam.sum()
    raise RuntimeError(f"active-set min-norm QP did not converge in {max_iter} iterations")


def min_norm_weights(m: np.ndarray) -> np.ndarray:
    """lam for each Gram matrix in a batch (..., S, S) -> (..., S)."""
    m = np.asarray(m, dtype=float)
    if m.shape[-1] == 2:
        return min_norm_two(m)
    flat = m.reshape(-1, m.shape[-2], m.shape[-1])
    return np.stack([min_norm_active_set(x) for x in flat]).reshape(m.shape[:-1])
