"""Gaussian mixtures with diagonal covariances: density, score, exact samples, and the closed-form
mixture along the diffusion (Gaussian-convolution) path."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DENSITY_FLOOR = 1e-9  # the official score divides by max(density, 1e-9)


@dataclass(frozen=True)
class GMM:
    """sum_k w_k N(means[k], diag(stds[k]**2)); means and stds have shape (K, d)."""

    means: np.ndarray
    stds: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        means, stds, weights = (np.asarray(a, dtype=np.float64) for a in (self.means, self.stds, self.weights))
        if means.ndim != 2 or stds.shape != means.shape or weights.shape != (means.shape[0],):
            raise ValueError(
                f"means {means.shape}, stds {stds.shape}, weights {weights.shape} do not fit (K, d), (K, d), (K,)"
            )
        if (stds <= 0).any() or (weights < 0).any() or not np.isclose(weights.sum(), 1.0):
            raise ValueError("stds must be > 0 and weights >= 0 summing to 1")
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "stds", stds)
        object.__setattr__(self, "weights", weights)
        with np.errstate(divide="ignore"):
            log_w = np.log(weights)
        var = stds**2
        object.__setattr__(self, "_prec", 1.0 / var)
        object.__setattr__(self, "_log_const", log_w - 0.5 * (means.shape[1] * np.log(2 * np.pi) + np.log(var).sum(-1)))

    @property
    def dim(self) -> int:
        return self.means.shape[1]

    @property
    def lipschitz(self) -> float:
        """L_pi = 1 / sigma_min^2: an upper bound of the curvature of -log pi."""
        return float(1.0 / self.stds.min() ** 2)

    @property
    def convexity(self) -> float:
        """a_pi = 1 / sigma_max^2, the 'min curvature' constant of the official step rule."""
        return float(1.0 / self.stds.max() ** 2)

    def convolved(self, tau: float) -> GMM:
        """Law of sqrt(1-tau) X + sqrt(tau) Z, X ~ this mixture, Z ~ N(0, I) (spec §2)."""
        return GMM(np.sqrt(1.0 - tau) * self.means, np.sqrt((1.0 - tau) * self.stds**2 + tau), self.weights)

    def _log_components(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(log(w_k N(x; m_k, s_k^2)) of shape (K, n), (x - m_k) / s_k^2 of shape (K, n, d)) for x of shape (n, d).
        Component-major, so that the reductions over k run across K rows of length n (numpy reduces the
        short trailing axis of an (n, K) array about eight times slower)."""
        diff = x[None, :, :] - self.means[:, None, :]
        scaled = diff * self._prec[:, None, :]
        quad = diff[..., 0] * scaled[..., 0] if self.dim == 1 else np.einsum("knd,knd->kn", diff, scaled)
        return self._log_const[:, None] - 0.5 * quad, scaled

    def log_density(self, x: np.ndarray) -> np.ndarray:
        logc, _ = self._log_components(np.atleast_2d(x))
        top = logc.max(axis=0)
        return top + np.log(np.exp(logc - top).sum(axis=0))

    def density(self, x: np.ndarray) -> np.ndarray:
        return np.exp(self.log_density(x))

    def score(self, x: np.ndarray) -> np.ndarray:
        """grad log pi(x), responsibilities by log-sum-exp (stable far from every mode)."""
        logc, scaled = self._log_components(np.atleast_2d(x))
        resp = np.exp(logc - logc.max(axis=0))
        resp /= resp.sum(axis=0)
        return -(resp[:, :, None] * scaled).sum(axis=0)

    def official_score(self, x: np.ndarray) -> np.ndarray:
        """The official code's score: float32 densities, no log-sum-exp, divided by max(density, 1e-9);
        it underflows to about 0 far from the modes (spec §9). Returned as float64."""
        x = np.atleast_2d(x).astype(np.float32)
        means, var, w = (
            self.means.astype(np.float32),
            (self.stds**2).astype(np.float32),
            self.weights.astype(np.float32),
        )
        norm = w / np.sqrt(np.float32((2 * np.pi) ** self.dim) * np.prod(var, axis=1))
        density = np.zeros(x.shape[0], dtype=np.float32)
        inner = np.zeros_like(x)
        for k in range(len(w)):
            diff = x - means[k]
            dens_k = np.exp(np.float32(-0.5) * (diff**2 / var[k]).sum(-1)) * norm[k]
            density += dens_k
            inner -= dens_k[:, None] * diff / var[k]
        return (inner / np.maximum(density, np.float32(DENSITY_FLOOR))[:, None]).astype(np.float64)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        k = rng.choice(len(self.weights), size=n, p=self.weights)
        return self.means[k] + self.stds[k] * rng.standard_normal((n, self.dim))
