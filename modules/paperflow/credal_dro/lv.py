"""The support-restricted linear-vacuous (LV) credal set and its closed forms (spec §2, Thm 2.1, Props 2.3-2.4).

A = {(1 - eps) P_{c,Xi0} + eps R : R in P(Xi0)}; for any loss f,
    sup_{Q in A} E_Q f = (1 - eps) E_{P_{c,Xi0}} f + eps sup_{Xi0} f          (Thm 2.1, "mean + sup")
and the closed-form sups of affine-type losses over a bulk are in `sup_*`. The same module holds the
upper-tail mean (reverse LV / CVaR) and the TV-ball value used by the identity checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import cvxpy as cp
import numpy as np

from paperflow.credal_dro.bulk import Bulk


def lv_value(losses_in_bulk: np.ndarray, sup: float, eps: float) -> float:
    """Thm 2.1: (1 - eps) * mean over central samples inside the bulk + eps * sup over the bulk."""
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps must be in [0, 1], got {eps}")
    return (1.0 - eps) * float(np.mean(losses_in_bulk)) + eps * float(sup)


def sup_linear(bulk: Bulk, a: np.ndarray, b: float) -> float:
    """sup over Xi0 of a^T xi + b = a^T mu + b + sum of block supports (t m2(a) or t m1(a))."""
    return float(a @ bulk.mu + b + bulk.support(a))


def sup_relu(bulk: Bulk, a: np.ndarray, b: float) -> float:
    return max(0.0, sup_linear(bulk, a, b))


def sup_abs(bulk: Bulk, a: np.ndarray, b: float) -> float:
    """|C| + support(a): the bulk is symmetric about mu, so sup |a^T xi + b| = |a^T mu + b| + support(a)."""
    return abs(float(a @ bulk.mu + b)) + bulk.support(a)


def sup_piecewise(bulk: Bulk, a_pieces: np.ndarray, b_pieces: Sequence[float]) -> float:
    """sup of max_j (a_j^T xi + b_j) = max_j of the pieces' sups."""
    return max(sup_linear(bulk, a, b) for a, b in zip(a_pieces, b_pieces))


def support_expr(bulk: Bulk, a: cp.Expression) -> cp.Expression:
    """sup_{Xi0} a^T (xi - mu) for an affine cvxpy vector a: an SOC term per ellipsoid block, an l1 term per box block."""
    terms = []
    for blk in bulk.blocks:
        part = a[list(blk.idx)]
        if blk.geometry == "ellipsoid":
            terms.append(blk.t * cp.norm(np.linalg.cholesky(blk.shape).T @ part, 2))
        else:
            terms.append(blk.t * cp.sum(cp.multiply(blk.shape, cp.abs(part))))
    return cp.sum(cp.hstack(terms))


def upper_tail_mean(losses: np.ndarray, probs: np.ndarray, keep: float) -> float:
    """CVaR-up_{keep}: the mean of f over the upper `keep` fraction of P (Prop 2.4, reverse LV with
    keep = 1 - eps), i.e. sup of E_Q f over Q <= P / keep; a fractional atom at the boundary."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    order = np.argsort(-np.asarray(losses))
    f, p = np.asarray(losses)[order], np.asarray(probs)[order]
    taken = np.minimum(p, np.maximum(keep - (np.cumsum(p) - p), 0.0))
    return float(f @ taken / keep)


def tv_ball_value(losses: np.ndarray, probs: np.ndarray, eps: float) -> float:
    """sup over the TV ball of radius eps around P: (1 - eps) CVaR-up_{1-eps} + eps max f (Prop 2.4)."""
    if eps >= 1.0:
        return float(np.max(losses))
    return (1.0 - eps) * upper_tail_mean(losses, probs, 1.0 - eps) + eps * float(np.max(losses))


def cvar_expr(losses: cp.Expression, alpha: float) -> tuple[cp.Expression, list]:
    """Rockafellar-Uryasev: CVaR_alpha (mean of the worst alpha fraction) = min_eta eta + E(l - eta)_+ / alpha,
    in epigraph form."""
    eta, u = cp.Variable(), cp.Variable(losses.shape[0], nonneg=True)
    return eta + cp.sum(u) / (losses.shape[0] * alpha), [u >= losses - eta]


def kl_dual(losses: cp.Expression, radius: float) -> tuple[cp.Expression, list]:
    """KL-DRO dual: sup_{KL(Q||P_n) <= rho} E_Q l = min_{lam>0, t} t + lam rho + lam log E exp((l - t)/lam),
    written with exponential cones as in `dro.linear_model.KLDRO`."""
    n = losses.shape[0]
    lam, t, z = cp.Variable(), cp.Variable(), cp.Variable(n)
    cons = [lam >= 0, cp.sum(z) <= n * lam, cp.constraints.ExpCone(losses - t, lam * np.ones(n), z)]
    return t + lam * radius, cons
