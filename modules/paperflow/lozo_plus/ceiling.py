"""The capture ratio LOZO+'s selection should reach at a refresh step, in closed form from the gradient's spectrum.

Set-up (a refresh step, exact two-point scores, the probe's gradient G the one the candidates were scored on): write
every matrix's gradient by its singular value decomposition, G_W = sum_i s_Wi a_Wi b_Wi^T, and call each (W, i) a
component j with energy e_j = s_Wi^2 and column dimension n_j = n_W. With one shared probe u_W per matrix and
candidate columns v_k ~ N(0, I), the score of candidate k is

    c_k = sum_W u_W^T G_W v_kW = sum_j s_j alpha_j beta_kj,   alpha_j = u_W . a_Wi,  beta_kj = v_kW . b_Wi,

all alpha_j and beta_kj independent N(0, 1). Given alpha, x_k = c_k / sd(c) are i.i.d. N(0, 1) and
beta_kj = r_j x_k + sqrt(1 - r_j^2) noise with r_j^2 = e_j alpha_j^2 / sum_i e_i alpha_i^2, so a kept candidate
carries E[beta_kj^2 | x_k] = r_j^2 x_k^2 + 1 - r_j^2. A column v captures ||G_W P_v||^2 ~ sum_i e_i beta_i^2 / n_W
(||v||^2 ~ n_W), so the expected captured energy of the kept set S, over LOZO's r fresh columns, is

    rho_ratio^2 = [A E(X_S) + (B - A) E|S|] / (r B),   B = sum_j e_j / n_j,   A = sum_j (e_j / n_j) E[r_j^2],

with X_S = sum_{k in S} x_k^2 over the greedy prefix (the largest |x| first, |x_k| >= kappa max |x|, at most m
candidates, at least one). E(X_S) and E|S| are order-statistic integrals of |N(0, 1)| (`selection_moments`);
E[r_j^2] = int_0^inf e_j (1 + 2 t e_j)^(-3/2) prod_{i != j} (1 + 2 t e_i)^(-1/2) dt (`alignment`, from
E[X exp(-t X)] for chi-square variables). The random-candidate control keeps |S| columns with no selection, so its
ratio^2 is E|S| / r. The ratio is that of root-mean-square capture ratios (`rms`), which the report measures the same
way at refresh steps. `tests/papers/test_lozo_plus.py` checks it against a Monte Carlo of the selection itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import erf

if TYPE_CHECKING:
    import torch

GRID = 1500  # points per axis of the order-statistic quadrature
TOP = 9.0  # |N(0,1)| above this has probability < 1e-18


def _half_normal(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pdf, cdf) of |N(0, 1)| at y >= 0."""
    pdf = np.sqrt(2 / np.pi) * np.exp(-0.5 * y**2)
    cdf = erf(y / math.sqrt(2))
    return pdf, cdf


@lru_cache(maxsize=64)
def selection_moments(candidates: int, kappa: float, most: int) -> tuple[float, float]:
    """(E[X_S], E[|S|]) of the greedy prefix: K = `candidates` i.i.d. N(0, 1) scores, ordered by |x|, kept while
    |x| >= kappa max |x|, at most `most` of them, at least one. Conditioning on the largest, a: the other K - 1 are
    i.i.d. |N(0,1)| truncated to [0, a], and the j-th largest of them (density of an order statistic) is kept when
    it is >= kappa a and j < most."""
    if candidates < 1 or most < 1:
        raise ValueError(f"selection_moments: candidates ({candidates}) and most ({most}) must be >= 1")
    a = np.linspace(0.0, TOP, GRID)[1:]
    fa, Fa = _half_normal(a)
    w_a = candidates * fa * Fa ** (candidates - 1)  # density of the largest |x|
    da = a[1] - a[0]
    ex, es = np.trapezoid(w_a * a**2, dx=da), 1.0
    n = candidates - 1
    if n == 0 or most == 1:
        return float(ex), es
    u = np.linspace(0.0, 1.0, GRID)  # y = lo + u (a - lo), lo = kappa a: the kept range of the others
    lo = kappa * a
    y = lo[:, None] + u[None, :] * (a - lo)[:, None]
    fy, Fy = _half_normal(y)
    h, H = fy / Fa[:, None], Fy / Fa[:, None]  # truncated to [0, a]
    jac = (a - lo)[:, None] * (u[1] - u[0])
    for j in range(1, min(most - 1, n) + 1):  # the j-th largest of the n others
        coef = math.comb(n, j) * j
        dens = coef * h * H ** (n - j) * (1 - H) ** (j - 1)
        inner_x = np.trapezoid(dens * y**2, dx=1.0, axis=1) * jac[:, 0]
        inner_s = np.trapezoid(dens, dx=1.0, axis=1) * jac[:, 0]
        ex += np.trapezoid(w_a * inner_x, dx=da)
        es += np.trapezoid(w_a * inner_s, dx=da)
    return float(ex), float(es)


def alignment(energies: Sequence[float]) -> np.ndarray:
    """E[r_j^2] = E[e_j alpha_j^2 / sum_i e_i alpha_i^2] for i.i.d. N(0, 1) alpha (they sum to 1)."""
    e = np.asarray(energies, float)
    e = e[e > 0] / e.sum() if e.sum() > 0 else e
    out = np.zeros(len(energies))
    if not len(e):
        return out
    s = np.linspace(-30.0, 30.0, 601)  # t = exp(s): the integrand spans many decades
    t = np.exp(s)
    log1p = np.log1p(2 * t[None, :] * e[:, None])  # (components, grid)
    total = -0.5 * log1p.sum(0)
    vals = e[:, None] * np.exp(total[None, :] - log1p) * t[None, :]
    res = np.trapezoid(vals, s, axis=1)
    out[np.asarray(energies, float) > 0] = res
    return out


def spectra(grads: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """The squared singular values of each matrix gradient, largest first."""
    import torch  # here: the report job imports this module without torch

    return [torch.linalg.svdvals(g.double()).pow(2).numpy() for g in grads]


def components(grads: Sequence[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """(energies s_Wi^2, column dimensions n_W) of every singular component of every matrix gradient."""
    es = spectra(grads)
    return np.concatenate(es), np.concatenate([np.full(len(e), g.shape[1], float) for e, g in zip(es, grads)])


def rho_ratio(
    energies: Sequence[float], dims: Sequence[float], candidates: int, kappa: float, most: int, rank: int
) -> float:
    """The expected (root-mean-square) capture ratio of LOZO+'s kept set over LOZO's rank-`rank` one at a refresh
    step, for components of `energies` in matrices of column dimension `dims` (module docstring)."""
    e, n = np.asarray(energies, float), np.asarray(dims, float)
    if e.sum() <= 0:
        return float("nan")
    ex, es = selection_moments(int(candidates), float(kappa), int(most))
    b = float((e / n).sum())
    a = float((e / n * alignment(e)).sum())
    return math.sqrt((a * ex + (b - a) * es) / (rank * b))


def random_rho_ratio(candidates: int, kappa: float, most: int, rank: int) -> float:
    """The same for the random-candidate control: |S| random columns, no selection (E|S| / r)."""
    return math.sqrt(selection_moments(int(candidates), float(kappa), int(most))[1] / rank)


def rms(values: Sequence[float]) -> float:
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    return float(np.sqrt(np.mean(v**2))) if len(v) else float("nan")
