"""Annealing paths p_tau -> pi: the schedule tau(t), the drift b(x, tau) of each path and the
curvature constants (L, a) that set the adaptive step h = a / L^2 (spec §2)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from paperflow.annealed_langevin.gmm import GMM
from paperflow.annealed_langevin.settings import PATHS

LABELS = {
    "ula": "ULA",
    "diffusion": "diffusion",
    "tempering": "geometric tempering",
    "dilation": "dilation",
    "daz": "DAZ",
    "dilation_exact": "dilation (exact score)",
}
TEMPERING_DRIFTS = ("canonical", "official")
DILATION_DRIFTS = ("code", "exact")
SCORES = ("stable", "official")


def schedule(t: np.ndarray, T: float, tau0: float) -> np.ndarray:
    """tau(t) = tau0 * exp(-t / T) (spec §2, tau0 = 0.99)."""
    return tau0 * np.exp(-np.asarray(t, dtype=np.float64) / T)


def step_constants(
    path: str, tau: float, L_pi: float, a_pi: float, var_min: float, var_max: float
) -> tuple[float, float]:
    """(L, a): max and min curvature of -log p_tau as the official grids use them."""
    if path == "ula":
        return L_pi, a_pi
    if path == "diffusion":
        return 1.0 / ((1 - tau) * var_min + tau), 1.0 / ((1 - tau) * var_max + tau)
    if path == "tempering":
        return (1 - tau) * L_pi + tau, (1 - tau) * a_pi + tau
    if path in ("dilation", "dilation_exact"):
        return L_pi / (1 - tau), a_pi / (1 - tau)
    if path == "daz":
        if tau == 0:
            return L_pi, a_pi
        L = 1.0 / tau
        if 1 - L_pi * tau > 0:
            L = min(L, L_pi / (1 - L_pi * tau))
        return L, min(a_pi, 1.0 / tau)
    raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")


def prox(gmm: GMM, x: np.ndarray, tau: float, iters: int, score: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """prox_{tau f}(x) = argmin_y tau f(y) + |y - x|^2 / 2, f = -log pi, per particle: accelerated
    forward-backward (gradient step on tau f with 1/(tau L_pi), exact prox of the quadratic) from the
    starts {x, every mixture mean, 0}; the candidate with the lowest objective wins (spec §2)."""
    n, d = x.shape
    if tau == 0:
        return x.copy()
    starts = np.concatenate(
        [x[:, None, :], np.broadcast_to(gmm.means, (n, *gmm.means.shape)), np.zeros((n, 1, d))], axis=1
    )
    m = starts.shape[1]
    u = np.repeat(x, m, axis=0)
    y = starts.reshape(n * m, d)
    y_old = y.copy()
    L = tau * gmm.lipschitz
    for _ in range(iters):
        z = y + (y - y_old) / np.sqrt(2.0)
        forward = z + tau * score(z) / L
        y_old, y = y, (forward + u / L) / (1.0 + 1.0 / L)
    objective = -tau * gmm.log_density(y) + 0.5 * ((y - u) ** 2).sum(-1)
    best = objective.reshape(n, m).argmin(axis=1)
    return y.reshape(n, m, d)[np.arange(n), best]


def drift(
    path: str,
    gmm: GMM,
    *,
    tempering: str,
    dilation: str,
    score: str,
    prox_iters: int | None,
) -> Callable[[np.ndarray, float], np.ndarray]:
    """b(x, tau) of `path` (table of spec §2). Variants: tempering canonical (1-tau) s(x) - tau x or the
    official code's (1-tau) s(x / sqrt(1-tau)) - tau x; dilation as in the code, sqrt(1-tau)
    s(x / sqrt(1-tau)), or the exact score of pi(x / sqrt(1-tau)), s(x / sqrt(1-tau)) / sqrt(1-tau);
    score 'official' uses the float32 un-stabilised score (spec §9). `dilation_exact` is the dilation path with
    the exact drift whatever `dilation` says (the claims' control: it stays stuck like ULA, spec §9). `prox_iters`:
    DAZ's prox iterations (None for the other paths)."""
    if score not in SCORES:
        raise ValueError(f"unknown score {score!r}; known: {', '.join(SCORES)}")
    s = gmm.score if score == "stable" else gmm.official_score
    if path == "ula":
        return lambda x, tau: s(x)
    if path == "diffusion":
        if score == "stable":
            return lambda x, tau: gmm.convolved(tau).score(x)
        return lambda x, tau: gmm.convolved(tau).official_score(x)
    if path == "tempering":
        if tempering == "canonical":
            return lambda x, tau: (1 - tau) * s(x) - tau * x
        if tempering == "official":
            return lambda x, tau: (1 - tau) * s(x / np.sqrt(1 - tau)) - tau * x
        raise ValueError(f"unknown tempering drift {tempering!r}; known: {', '.join(TEMPERING_DRIFTS)}")
    if path == "dilation_exact":
        return lambda x, tau: s(x / np.sqrt(1 - tau)) / np.sqrt(1 - tau)
    if path == "dilation":
        if dilation == "code":
            return lambda x, tau: np.sqrt(1 - tau) * s(x / np.sqrt(1 - tau))
        if dilation == "exact":
            return lambda x, tau: s(x / np.sqrt(1 - tau)) / np.sqrt(1 - tau)
        raise ValueError(f"unknown dilation drift {dilation!r}; known: {', '.join(DILATION_DRIFTS)}")
    if path == "daz":
        if prox_iters is None:
            raise ValueError("the daz drift needs prox_iters")
        # -grad M_tau f(x) = -(x - prox)/tau = s_pi(prox_{tau f}(x)); at tau = 0 this is s_pi(x)
        return lambda x, tau: s(prox(gmm, x, tau, prox_iters, s))
    raise ValueError(f"unknown path {path!r}; known: {', '.join(PATHS)}")
