"""Bulk sets Xi0 = {xi : s(xi) <= t} and their DKW calibration (spec §2 items 2-3, Lemma 3.2).

A `Bulk` is a product of blocks over coordinate groups; each block is an ellipsoid
(s = ||Sigma^{-1/2}(xi - mu)||_2) or a box (s = max_i |xi_i - mu_i| / w_i) with its own threshold t.
A one-block bulk is the plain ellipsoid or box. The threshold of each block comes from a score sample
on a selection split disjoint from the fitting split, with gamma and delta split evenly across
blocks (union bound), so that P*(Xi0) >= 1 - gamma with probability >= 1 - delta.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

GEOMETRIES = ("ellipsoid", "box")


@dataclass(frozen=True)
class Block:
    """One coordinate block of the bulk: `idx` are the coordinates of xi it covers."""

    geometry: str
    idx: tuple[int, ...]
    mu: np.ndarray
    shape: np.ndarray  # ellipsoid: Sigma (k x k); box: half-widths w (k,)
    t: float = math.nan

    def score(self, xi: np.ndarray) -> np.ndarray:
        z = np.atleast_2d(xi)[:, list(self.idx)] - self.mu
        if self.geometry == "ellipsoid":
            root = np.linalg.cholesky(self.shape)
            return np.linalg.norm(np.linalg.solve(root, z.T), axis=0)
        return np.max(np.abs(z) / self.shape, axis=1)

    def support(self, a: np.ndarray) -> float:
        """sup over the block of a^T (xi_block - mu) = t * m2(a) (ellipsoid) or t * m1(a) (box)."""
        return self.t * (
            ellipsoid_norm(a, self.shape) if self.geometry == "ellipsoid" else float(np.sum(self.shape * np.abs(a)))
        )

    def with_t(self, t: float) -> Block:
        return Block(self.geometry, self.idx, self.mu, self.shape, float(t))


@dataclass(frozen=True)
class Bulk:
    blocks: tuple[Block, ...]
    gamma: float
    delta: float
    m_select: int
    certificate: dict = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return sum(len(b.idx) for b in self.blocks)

    @property
    def mu(self) -> np.ndarray:
        out = np.zeros(self.dim)
        for b in self.blocks:
            out[list(b.idx)] = b.mu
        return out

    def contains(self, xi: np.ndarray) -> np.ndarray:
        inside = np.ones(len(np.atleast_2d(xi)), dtype=bool)
        for b in self.blocks:
            inside &= b.score(xi) <= b.t
        return inside

    def support(self, a: np.ndarray) -> float:
        """sup_{xi in Xi0} a^T (xi - mu): block support functions add up."""
        a = np.asarray(a, dtype=float)
        return sum(b.support(a[list(b.idx)]) for b in self.blocks)

    def box_corners(self) -> tuple[np.ndarray, np.ndarray]:
        """lo, hi of an all-box bulk."""
        if any(b.geometry != "box" for b in self.blocks):
            raise ValueError("box_corners needs box blocks only")
        lo, hi = np.zeros(self.dim), np.zeros(self.dim)
        for b in self.blocks:
            lo[list(b.idx)], hi[list(b.idx)] = b.mu - b.t * b.shape, b.mu + b.t * b.shape
        return lo, hi

    def to_json(self) -> dict:
        return {
            "gamma": self.gamma,
            "delta": self.delta,
            "m_select": self.m_select,
            "certificate": self.certificate,
            "blocks": [
                {"geometry": b.geometry, "idx": list(b.idx), "mu": b.mu.tolist(), "shape": b.shape.tolist(), "t": b.t}
                for b in self.blocks
            ],
        }

    @staticmethod
    def from_json(doc: dict) -> Bulk:
        blocks = tuple(
            Block(b["geometry"], tuple(b["idx"]), np.asarray(b["mu"]), np.asarray(b["shape"]), b["t"])
            for b in doc["blocks"]
        )
        return Bulk(blocks, doc["gamma"], doc["delta"], doc["m_select"], doc.get("certificate", {}))


def ellipsoid_norm(a: np.ndarray, sigma: np.ndarray) -> float:
    """m2(a) = ||Sigma^{1/2} a||_2 = sqrt(a^T Sigma a)."""
    return float(np.sqrt(max(a @ sigma @ a, 0.0)))


def dkw_radius(m: int, delta: float) -> float:
    """r_{m,delta} = sqrt(log(2/delta) / (2m)) (DKW band with Massart's constant)."""
    return math.sqrt(math.log(2.0 / delta) / (2.0 * m))


def dkw_threshold(scores: np.ndarray, gamma: float, delta: float) -> float:
    """t_hat = inf{t : F_m(t) - r_{m,delta} >= 1 - gamma} = the k-th smallest score with
    k = ceil(m (1 - gamma + r)); Lemma 3.2 gives P*(s <= t_hat) >= 1 - gamma w.p. >= 1 - delta."""
    s = np.sort(np.asarray(scores, dtype=float))
    m = s.size
    r = dkw_radius(m, delta)
    k = math.ceil(m * (1.0 - gamma + r) - 1e-12)
    if k > m:
        raise ValueError(
            f"gamma = {gamma} is too small for m = {m} selection points at delta = {delta} "
            f"(needs gamma >= r_m,delta = {r:.4f}); raise gamma or m"
        )
    return float(s[max(k, 1) - 1])


def fit_block(
    geometry: str, idx: Sequence[int], xi_fit: np.ndarray, box_quantile: float | None, ridge: float = 1e-8
) -> Block:
    """Centre and shape of one block from the fitting split: ellipsoid = mean and covariance; box =
    coordinate medians and the `box_quantile` quantile of |xi - median| (spec §7; None without a box)."""
    if geometry not in GEOMETRIES:
        raise ValueError(f"geometry {geometry!r} not in {GEOMETRIES}")
    if geometry == "box" and box_quantile is None:
        raise ValueError("a box block needs box_quantile (the bulk config's box_quantile)")
    z = np.atleast_2d(xi_fit)[:, list(idx)]
    if geometry == "ellipsoid":
        sigma = np.atleast_2d(np.cov(z, rowvar=False))
        sigma = sigma + ridge * max(np.trace(sigma) / len(idx), 1.0) * np.eye(len(idx))
        return Block(geometry, tuple(idx), z.mean(axis=0), sigma)
    mu = np.median(z, axis=0)
    w = np.quantile(np.abs(z - mu), box_quantile, axis=0)
    return Block(geometry, tuple(idx), mu, np.maximum(w, 1e-12))


def calibrate(
    xi_fit: np.ndarray,
    xi_select: np.ndarray,
    blocks: Sequence[tuple[str, Sequence[int]]],
    gamma: float,
    delta: float,
    box_quantile: float | None,
) -> Bulk:
    """Fit every block on D_fit, set its threshold by DKW on D_select with gamma/B and delta/B."""
    n_blocks = len(blocks)
    fitted = []
    for geometry, idx in blocks:
        block = fit_block(geometry, idx, xi_fit, box_quantile)
        fitted.append(block.with_t(dkw_threshold(block.score(xi_select), gamma / n_blocks, delta / n_blocks)))
    bulk = Bulk(tuple(fitted), gamma, delta, len(xi_select))
    cert = {
        "dkw_radius": dkw_radius(len(xi_select), delta / n_blocks),
        "mass_lower_bound": 1.0 - gamma,
        "select_coverage": float(bulk.contains(xi_select).mean()),
        "fit_coverage": float(bulk.contains(xi_fit).mean()),
    }
    return Bulk(bulk.blocks, gamma, delta, len(xi_select), cert)
