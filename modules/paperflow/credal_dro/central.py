"""Central (reference) distributions P_c, each represented by N samples (spec §2 item 1).

- `empirical`: the data themselves (resampled to N when N differs);
- `bayes`: posterior predictive of a Gaussian model with the conjugate Normal-inverse-Wishart prior
  (a multivariate Student-t), drawn by sampling (mu, Sigma) from the posterior, then xi;
- `gcopula`: frequentist Gaussian copula: empirical marginal quantiles, correlation of normal scores.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

CENTRALS = ("empirical", "bayes", "gcopula")


def sample_central(kind: str, data: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    data = np.atleast_2d(np.asarray(data, dtype=float))
    if kind == "empirical":
        return data.copy() if n == len(data) else data[rng.integers(0, len(data), n)]
    if kind == "bayes":
        return niw_predictive(data, n, rng)
    if kind == "gcopula":
        return gaussian_copula(data, n, rng)
    raise ValueError(f"central {kind!r} not in {CENTRALS}")


def niw_predictive(data: np.ndarray, n: int, rng: np.random.Generator, kappa0: float = 1e-2) -> np.ndarray:
    """Posterior predictive draws under N(mu, Sigma) with the NIW(m0 = data median, kappa0, nu0 = d + 2,
    Psi0 = I * mean variance) prior: one (mu, Sigma) posterior draw per sample."""
    m, d = data.shape
    m0, nu0 = np.median(data, axis=0), d + 2
    psi0 = np.eye(d) * float(np.mean(np.var(data, axis=0)))
    xbar = data.mean(axis=0)
    scatter = (data - xbar).T @ (data - xbar)
    kappa_n, nu_n = kappa0 + m, nu0 + m
    mu_n = (kappa0 * m0 + m * xbar) / kappa_n
    psi_n = psi0 + scatter + kappa0 * m / kappa_n * np.outer(xbar - m0, xbar - m0)
    sigmas = stats.invwishart(df=nu_n, scale=psi_n).rvs(size=n, random_state=rng).reshape(n, d, d)
    roots = np.linalg.cholesky(sigmas)
    mus = mu_n + np.einsum("nij,nj->ni", roots, rng.standard_normal((n, d))) / np.sqrt(kappa_n)
    return mus + np.einsum("nij,nj->ni", roots, rng.standard_normal((n, d)))


def gaussian_copula(data: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Normal scores via ranks, their correlation R; draws z ~ N(0, R) mapped back through the
    empirical marginal quantile functions (linear interpolation)."""
    m, d = data.shape
    ranks = stats.rankdata(data, axis=0) / (m + 1)
    corr = np.atleast_2d(np.corrcoef(stats.norm.ppf(ranks), rowvar=False))
    z = rng.multivariate_normal(np.zeros(d), corr, size=n, method="eigh")
    u = stats.norm.cdf(z)
    return np.column_stack([np.quantile(data[:, j], u[:, j]) for j in range(d)])
