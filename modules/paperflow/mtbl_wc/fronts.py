"""Seeded synthetic ECMO instances and their closed-form Pareto fronts (spec §4, §10).

quadratic: x in R^dx, y in R^dy, LL g = 0.5 ||A y - B x - b||^2 with A of rank < dy (convex, not
strongly convex in y), f_s = 0.5 ||y - c_s||^2 + 0.25 ||x - e_s||^2. The feasible set
{z : J z = A^T b}, J = [-A^T B, A^T A], is affine, so every weighted-sum solution is a linear solve
on its null-space parameterisation, and the weighted-Chebyshev (WC) point of a preference r is the
weighted-sum solution whose lam equalises r_1 (f_1 - f_1^*) = r_2 (f_2 - f_2^*) (bisection on lam_1).

concave: x in R^n, y in R^m, LL g = 0.5 ||C y - x||^2 (C of full row rank n < m), UL
f_s = FF_s(x) + 0.5 ||(I - C^+ C) y||^2 with the Fonseca-Fleming pair FF_s. The Pareto set is
x = t 1, t in [-1/sqrt(n), 1/sqrt(n)], y = C^+ x; its front is concave (non-convex).
"""

from __future__ import annotations

from typing import Any

import numpy as np

BISECTION_STEPS = 80


def _orthonormal(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(rows, cols)))
    return q * np.sign(np.diag(r))


def quadratic_instance(spec: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """A = U diag(linspace(sv)) V^T of the given rank, B = b_scale Gaussian / sqrt(dx), b ~ N(0, I)."""
    rng = np.random.default_rng(seed)
    dx, dy, rows, rank = spec["dim_x"], spec["dim_y"], spec["rows"], spec["rank"]
    u, v = _orthonormal(rng, rows, rank), _orthonormal(rng, dy, rank)
    a = u @ np.diag(np.linspace(*spec["sv_range"], rank)) @ v.T
    b_mat = spec["b_scale"] * rng.normal(size=(rows, dx)) / np.sqrt(dx)
    b = rng.normal(size=rows)
    c = spec["c_scale"] * rng.normal(size=(spec["n_obj"], dy))
    e = rng.normal(size=(spec["n_obj"], dx))
    return {"A": a, "B": b_mat, "b": b, "c": c, "e": e}


def concave_instance(spec: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """C = U diag(linspace(sv)) V^T with n rows and full row rank."""
    rng = np.random.default_rng(seed)
    n, m = spec["dim_x"], spec["dim_y"]
    c = _orthonormal(rng, n, n) @ np.diag(np.linspace(*spec["sv_range"], n)) @ _orthonormal(rng, m, n).T
    return {"C": c}


def null_space(mat: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    _, s, vt = np.linalg.svd(mat)
    rank = int(np.sum(s > rtol * s[0]))
    return vt[rank:].T


def quadratic_targets(inst: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Targets t_s = (e_s, c_s) and the diagonal metric D with f_s = 0.5 (z - t_s)^T D (z - t_s)."""
    dx, dy = inst["e"].shape[1], inst["c"].shape[1]
    return np.hstack([inst["e"], inst["c"]]), np.concatenate([np.full(dx, 0.5), np.ones(dy)])


def quadratic_jacobian(inst: dict[str, np.ndarray]) -> np.ndarray:
    """J = d/dz [A^T (A y - B x - b)] = [-A^T B, A^T A] (constant)."""
    a = inst["A"]
    return np.hstack([-a.T @ inst["B"], a.T @ a])


def quadratic_weighted_sum(inst: dict[str, np.ndarray], lam: np.ndarray) -> np.ndarray:
    """Exact minimisers z (K, d) of sum_s lam_s f_s on the feasible set, for weights lam (K, S)."""
    jac = quadratic_jacobian(inst)
    rhs = inst["A"].T @ inst["b"]
    z0 = np.linalg.lstsq(jac, rhs, rcond=None)[0]
    n = null_space(jac)
    targets, dmat = quadratic_targets(inst)
    tbar = np.asarray(lam) @ targets / np.sum(lam, axis=1, keepdims=True)
    lhs = n.T @ (dmat[:, None] * n)
    u = np.linalg.solve(lhs, (n.T @ (dmat[:, None] * (tbar - z0).T)))
    return z0 + (n @ u).T


def quadratic_objectives(inst: dict[str, np.ndarray], z: np.ndarray) -> np.ndarray:
    targets, dmat = quadratic_targets(inst)
    diff = z[:, None, :] - targets[None]
    return 0.5 * np.einsum("ksd,d,ksd->ks", diff, dmat, diff)


def _bisect(gap, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Root of gap(t) (vectorised) with gap(lo) > 0 > gap(hi)."""
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        positive = gap(mid) > 0
        lo, hi = np.where(positive, mid, lo), np.where(positive, hi, mid)
    return 0.5 * (lo + hi)


def quadratic_front(inst: dict[str, np.ndarray], prefs: np.ndarray, n_front: int) -> dict[str, np.ndarray]:
    """Ideal point, dense exact front, and for each preference r (K, 2) the WC and LS solutions."""
    ideal = np.diag(quadratic_objectives(inst, quadratic_weighted_sum(inst, np.eye(2))))
    grid = np.linspace(0.0, 1.0, n_front)
    front = quadratic_objectives(inst, quadratic_weighted_sum(inst, np.stack([grid, 1 - grid], 1)))

    def gap(l1):
        f = quadratic_objectives(inst, quadratic_weighted_sum(inst, np.stack([l1, 1 - l1], 1)))
        return prefs[:, 0] * (f[:, 0] - ideal[0]) - prefs[:, 1] * (f[:, 1] - ideal[1])

    lam1 = _bisect(gap, np.zeros(len(prefs)), np.ones(len(prefs)))
    z_wc = quadratic_weighted_sum(inst, np.stack([lam1, 1 - lam1], 1))
    z_ls = quadratic_weighted_sum(inst, prefs)
    return {
        "ideal": ideal,
        "front": front,
        "z_wc": z_wc,
        "f_wc": quadratic_objectives(inst, z_wc),
        "lam_wc": np.stack([lam1, 1 - lam1], 1),
        "z_ls": z_ls,
        "f_ls": quadratic_objectives(inst, z_ls),
    }


def fonseca_fleming(x: np.ndarray) -> np.ndarray:
    """FF_1, FF_2 of x (K, n): 1 - exp(-||x -+ 1/sqrt(n)||^2)."""
    shift = 1.0 / np.sqrt(x.shape[-1])
    return np.stack([1 - np.exp(-np.sum((x - shift) ** 2, -1)), 1 - np.exp(-np.sum((x + shift) ** 2, -1))], -1)


def concave_front(inst: dict[str, np.ndarray], prefs: np.ndarray, n_front: int) -> dict[str, np.ndarray]:
    """Ideal point (0, 0), dense exact front, and the WC point of each preference (bisection on t)."""
    c = inst["C"]
    n = c.shape[0]
    bound = 1.0 / np.sqrt(n)
    t = np.linspace(-bound, bound, n_front)
    front = fonseca_fleming(t[:, None] * np.ones(n))

    def gap(tt):
        f = fonseca_fleming(tt[:, None] * np.ones(n))
        return prefs[:, 0] * f[:, 0] - prefs[:, 1] * f[:, 1]

    t_wc = _bisect(gap, np.full(len(prefs), -bound), np.full(len(prefs), bound))
    x_wc = t_wc[:, None] * np.ones(n)
    z_wc = np.hstack([x_wc, x_wc @ np.linalg.pinv(c).T])
    return {"ideal": np.zeros(2), "front": front, "z_wc": z_wc, "f_wc": fonseca_fleming(x_wc)}
