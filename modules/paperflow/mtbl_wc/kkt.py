"""KKT-based Pareto stationarity of an equality-constrained multi-objective problem (spec §2, §8).

    K(z) = min_{lam in simplex} || (I - P_J) G^T lam ||^2 + || h(z) ||^2

P_J projects onto the row space of J = dh/dz, taken from the eigenpairs of J J^T with a relative rank cut-off, so a
rank-deficient Jacobian (lower level convex but not strongly convex) is handled without inverting
J J^T. The first term is the multiplier-optimal stationarity residual: min over mu of
|| G^T lam + J^T mu ||^2 equals || (I - P_J) G^T lam ||^2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paperflow.mtbl_wc.qp import min_norm_weights

RANK_RTOL = 1e-6


@dataclass(frozen=True)
class Stationarity:
    """Batched K(z) and its parts: `value` = `stationarity` + `feasibility`; `weights` = optimal lam."""

    value: np.ndarray
    stationarity: np.ndarray
    feasibility: np.ndarray
    weights: np.ndarray


def row_space_basis(jac: np.ndarray, rtol: float = RANK_RTOL) -> list[np.ndarray]:
    """For each (m, d) Jacobian in a batch (B, m, d), an orthonormal (d, rank) basis of its row space:
    from the eigenpairs of J J^T (m x m, cheaper than an SVD of J when d >> m), v_i = J^T u_i / s_i,
    keeping singular values s_i > rtol * s_max."""
    evals, evecs = np.linalg.eigh(np.einsum("bmd,bnd->bmn", jac, jac))
    bases = []
    for lam, u, j in zip(evals, evecs, jac):
        sv = np.sqrt(np.maximum(lam, 0.0))
        keep = sv > rtol * max(float(sv[-1]), 1e-300)
        bases.append(j.T @ u[:, keep] / sv[keep])
    return bases


def project_out(grads: np.ndarray, bases: list[np.ndarray]) -> np.ndarray:
    """(I - P_J) applied to each gradient: grads (B, S, d) -> (B, S, d)."""
    return np.stack([g - (g @ q) @ q.T for g, q in zip(grads, bases)])


def kkt_measure(grads: np.ndarray, jac: np.ndarray, h: np.ndarray) -> Stationarity:
    """K(z) for a batch: grads (B, S, d) objective gradients, jac (B, m, d), h (B, m)."""
    projected = project_out(grads, row_space_basis(jac))
    gram = np.einsum("bsd,btd->bst", projected, projected)
    lam = min_norm_weights(gram)
    stat = np.maximum(np.einsum("bs,bst,bt->b", lam, gram, lam), 0.0)
    feas = np.sum(h**2, axis=-1)
    return Stationarity(value=stat + feas, stationarity=stat, feasibility=feas, weights=lam)
