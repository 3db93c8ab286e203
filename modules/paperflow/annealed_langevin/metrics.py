"""Histogram KL and TV of particles against the target, as the official code defines them (spec §8).

Bins: equal-width over the range of the exact ground-truth samples. Reference mass Q per bin:
1-D, bin width x mean of the density at the two edges; 2-D, density at the cell centre x cell area;
n-D marginals, the histogram of the ground-truth samples. P = particle counts (particles outside the
range are dropped), normalised. KL = sum P log(max(P, 1e-9) / Q) with Q += 1e-9 renormalised;
TV = sum |P - Q| (no 1/2 factor, as in the code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paperflow.annealed_langevin.gmm import GMM

EPS = 1e-9
METRIC_KINDS = ("density_1d", "density_2d", "marginals")


@dataclass(frozen=True)
class Reference:
    """Per panel (the one joint histogram, or one marginal each): bin edges and reference mass Q."""

    edges: list[tuple[np.ndarray, ...]]
    mass: list[np.ndarray]
    columns: list[tuple[int, ...]]


def reference(kind: str, gmm: GMM, gt: np.ndarray, bins: list[int], n_marginals: int | None) -> Reference:
    """The reference of metric `kind`; `n_marginals` is used by the marginals kind only."""
    if kind == "density_1d":
        edges = np.linspace(gt[:, 0].min(), gt[:, 0].max(), bins[0] + 1)
        dens = gmm.density(edges[:, None])
        return Reference([(edges,)], [np.diff(edges) * 0.5 * (dens[1:] + dens[:-1])], [(0,)])
    if kind == "density_2d":
        ex = np.linspace(gt[:, 0].min(), gt[:, 0].max(), bins[0] + 1)
        ey = np.linspace(gt[:, 1].min(), gt[:, 1].max(), bins[1] + 1)
        cx, cy = 0.5 * (ex[1:] + ex[:-1]), 0.5 * (ey[1:] + ey[:-1])
        grid = np.stack(np.meshgrid(cx, cy, indexing="ij"), axis=-1).reshape(-1, 2)
        area = np.outer(np.diff(ex), np.diff(ey))
        return Reference([(ex, ey)], [gmm.density(grid).reshape(len(cx), len(cy)) * area], [(0, 1)])
    if kind == "marginals":
        edges, mass = [], []
        for j in range(n_marginals):
            counts, e = np.histogram(gt[:, j], bins=bins[0])
            edges.append((e,))
            mass.append(counts.astype(np.float64))
        return Reference(edges, mass, [(j,) for j in range(n_marginals)])
    raise ValueError(f"unknown metric kind {kind!r}; known: {', '.join(METRIC_KINDS)}")


def _normalise(a: np.ndarray) -> np.ndarray:
    return a / a.sum()


def histogram_kl(p_counts: np.ndarray, q_mass: np.ndarray) -> float:
    p = _normalise(p_counts.astype(np.float64))
    q = _normalise(q_mass + EPS)
    return float((p * np.log(np.maximum(p, EPS) / q)).sum())


def histogram_tv(p_counts: np.ndarray, q_mass: np.ndarray) -> float:
    return float(np.abs(_normalise(p_counts.astype(np.float64)) - _normalise(q_mass)).sum())


def panel_metrics(x: np.ndarray, ref: Reference) -> list[tuple[float, float]]:
    """(KL, TV) of particles x (n, d) for every panel of the reference."""
    out = []
    for edges, mass, cols in zip(ref.edges, ref.mass, ref.columns):
        counts, _ = np.histogramdd(x[:, list(cols)], bins=list(edges))
        out.append((histogram_kl(counts, mass), histogram_tv(counts, mass)))
    return out


def noise_floor(gmm: GMM, ref: Reference, n: int, rng: np.random.Generator) -> list[tuple[float, float]]:
    """The same metrics for n exact samples in place of particles (the official `KL_gt` column)."""
    return panel_metrics(gmm.sample(n, rng), ref)
