"""Heavy-tailed multi-item newsvendor (spec §7, generator [R]): data, costs and the decision problems.

Demand xi_j = loc + scale * T_j, T_j iid Student-t(df); cost per item max(h (x_j - xi_j), b (xi_j - x_j)),
i.e. h (x - xi)_+ + b (xi - x)_+. Contaminated test: a fraction of the draws replaced by in-bulk
high-demand spikes mu + U(lo_u, hi_u) (hi - mu), hi the upper corner of the calibrated box bulk.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import cvxpy as cp
import numpy as np

from paperflow.credal_dro.bulk import Bulk
from paperflow.credal_dro.lv import cvar_expr, kl_dual
from paperflow.credal_dro.solvers import solve

KL_LOSS_SCALES = (1.0, 10.0, 100.0)


def demand(n: int, cfg: Mapping[str, Any], rng: np.random.Generator) -> np.ndarray:
    return cfg["loc"] + cfg["scale"] * rng.standard_t(cfg["df"], size=(n, cfg["dim"]))


def contaminate(
    clean: np.ndarray, bulk: Bulk, frac: float, spike: tuple[float, float], rng: np.random.Generator
) -> np.ndarray:
    """Replace a `frac` share of rows by in-bulk spikes mu + U(spike) * (hi - mu)."""
    out = clean.copy()
    rows = rng.random(len(out)) < frac
    mu, (_, hi) = bulk.mu, bulk.box_corners()
    out[rows] = mu + rng.uniform(*spike, size=(rows.sum(), out.shape[1])) * (hi - mu)
    return out


def cost(x: np.ndarray, xi: np.ndarray, h: float, b: float) -> np.ndarray:
    """Total cost of decision x (d,) for each demand row of xi (n, d)."""
    return np.sum(np.maximum(h * (x - xi), b * (xi - x)), axis=1)


def sup_cost_box(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, h: float, b: float) -> float:
    """Closed-form sup of the cost over the box [lo, hi]: per item the worst corner, max(h (x - lo), b (hi - x))."""
    return float(np.sum(np.maximum(h * (x - lo), b * (hi - x))))


def _row_costs(x: cp.Variable, xi: np.ndarray, h: float, b: float) -> tuple[cp.Expression, list]:
    """Per-row costs (n,) in epigraph form z_ij >= both pieces (cvxpy's `maximum` trips HiGHS's bound
    propagation in cvxpy 1.9, the epigraph does not)."""
    z = cp.Variable(xi.shape)
    diff = x[None, :] - xi
    return cp.sum(z, axis=1), [z >= h * diff, z >= -b * diff]


def _sup_box_expr(x: cp.Variable, lo: np.ndarray, hi: np.ndarray, h: float, b: float) -> tuple[cp.Expression, list]:
    s = cp.Variable(len(lo))
    return cp.sum(s), [s >= h * (x - lo), s >= b * (hi - x)]


def solve_lv(central: np.ndarray, bulk: Bulk, eps: float, h: float, b: float, solver: str) -> np.ndarray:
    """argmin_x (1 - eps) mean_{central in Xi0} cost + eps sup_{Xi0} cost: an LP over a box bulk."""
    inside = central[bulk.contains(central)]
    if len(inside) == 0:
        raise ValueError("no central sample falls inside the bulk")
    lo, hi = bulk.box_corners()
    x = cp.Variable(central.shape[1])
    costs, cons = _row_costs(x, inside, h, b)
    sup, cons_sup = _sup_box_expr(x, lo, hi, h, b)
    objective = (1 - eps) * cp.sum(costs) / len(inside) + eps * sup
    solve(cp.Problem(cp.Minimize(objective), cons + cons_sup), solver)
    return np.asarray(x.value)


def solve_saa(central: np.ndarray, h: float, b: float, solver: str) -> np.ndarray:
    """Plain SAA: argmin_x mean cost over every central sample."""
    x = cp.Variable(central.shape[1])
    costs, cons = _row_costs(x, central, h, b)
    solve(cp.Problem(cp.Minimize(cp.sum(costs) / len(central)), cons), solver)
    return np.asarray(x.value)


def solve_saa_truncated(central: np.ndarray, bulk: Bulk, h: float, b: float, solver: str) -> np.ndarray:
    """Truncated SAA, the spec's "SAA (eps = 0)": SAA over the central samples inside the bulk only, i.e. the
    LV problem at eps = 0 (the mean over P_c restricted to Xi0, no sup term)."""
    inside = central[bulk.contains(central)]
    if len(inside) == 0:
        raise ValueError("no central sample falls inside the bulk")
    return solve_saa(inside, h, b, solver)


def solve_cvar(central: np.ndarray, alpha: float, h: float, b: float, solver: str) -> np.ndarray:
    """CVaR-DRO: minimise the mean of the worst alpha fraction of costs (the CVaR ball of `dro.CVaRDRO`)."""
    x = cp.Variable(central.shape[1])
    costs, cons = _row_costs(x, central, h, b)
    objective, cons_cvar = cvar_expr(costs, alpha)
    solve(cp.Problem(cp.Minimize(objective), cons + cons_cvar), solver)
    return np.asarray(x.value)


def solve_kl(central: np.ndarray, radius: float, h: float, b: float, solver: str) -> np.ndarray:
    """KL-DRO around the central samples (with a Bayesian posterior predictive centre: DRO-BAS-like).
    The argmin does not change when the losses are divided by a constant; Clarabel's exponential-cone
    iterations occasionally fail at one loss scale, so the next scale is tried before giving up."""
    errors = []
    for scale in KL_LOSS_SCALES:
        x = cp.Variable(central.shape[1])
        costs, cons = _row_costs(x, central, h, b)
        objective, cons_kl = kl_dual(costs / scale, radius)
        try:
            solve(cp.Problem(cp.Minimize(objective), cons + cons_kl), solver)
            return np.asarray(x.value)
        except (cp.error.SolverError, RuntimeError) as exc:
            errors.append(f"scale {scale}: {exc}")
    raise RuntimeError(f"KL-DRO failed at every loss scale: {errors}")


def decide(
    method: str, grid: list[float], central: np.ndarray, bulk: Bulk, h: float, b: float, solver: str
) -> list[dict]:
    """One decision per value of the method's parameter grid, with its solve time."""
    out = []
    for value in grid if method not in ("saa", "saa_trunc") else [0.0]:
        t0 = time.perf_counter()
        if method == "saa":
            x = solve_saa(central, h, b, solver)
        elif method == "saa_trunc":
            x = solve_saa_truncated(central, bulk, h, b, solver)
        elif method == "lv":
            x = solve_lv(central, bulk, value, h, b, solver)
        elif method == "cvar":
            x = solve_cvar(central, value, h, b, solver)
        elif method == "kl":
            x = solve_kl(central, value, h, b, solver)
        else:
            raise ValueError(f"unknown newsvendor method {method!r}")
        out.append({"param": float(value), "x": x.tolist(), "solve_s": time.perf_counter() - t0})
    return out
