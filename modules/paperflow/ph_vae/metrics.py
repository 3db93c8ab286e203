"""Tail and dependence metrics of PH-VAE, as the official notebooks define them (spec §8), in float64.

Marginal: conditional tail KS above the true q-quantile and quantile errors; for real data the true
law is replaced by the empirical law of held-out data. Multivariate: log1p correlation error,
Kendall tau error and tail co-exceedance with thresholds from the real data only.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats
from scipy.stats.distributions import rv_frozen

Curve = Callable[[NDArray[np.float64]], NDArray[np.float64]]


def ks_tail(samples: ArrayLike, q: float, cdf: Curve, ppf: Callable[[float], float], min_tail: int = 200) -> float:
    """Conditional tail KS@q (spec §8).

    t_q = ppf(q); the n_tail samples above t_q, sorted, get ECDF i / n_tail (i = 1..n_tail, the
    official convention: (i - 1) / n_tail is not checked, unlike scipy's two-sided KS) against the
    true conditional CDF clip((F(x) - q) / (1 - q), 0, 1). NaN when n_tail < min_tail.
    """
    x = np.asarray(samples, dtype=np.float64)
    tail = np.sort(x[x > ppf(q)])
    if tail.size < min_tail:
        return float("nan")
    ecdf = np.arange(1, tail.size + 1) / tail.size
    conditional = np.clip((cdf(tail) - q) / (1.0 - q), 0.0, 1.0)
    return float(np.max(np.abs(ecdf - conditional)))


def _empirical_law(reference: ArrayLike) -> tuple[Curve, Callable[[float], float]]:
    """CDF (fraction of reference <= x) and quantile function (np.quantile, linear) of held-out data."""
    ref = np.sort(np.asarray(reference, dtype=np.float64))

    def cdf(x: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.searchsorted(ref, x, side="right") / ref.size

    def ppf(p: float) -> float:
        return float(np.quantile(ref, p))

    return cdf, ppf


def ks_tail_empirical(samples: ArrayLike, reference: ArrayLike, q: float, min_tail: int = 200) -> float:
    """KS_tail@q with the true law replaced by the empirical law of held-out `reference` data
    (spec §8, real data)."""
    cdf, ppf = _empirical_law(reference)
    return ks_tail(samples, q, cdf, ppf, min_tail)


def quantile_error(samples: ArrayLike, p: float, true_quantile: float) -> dict[str, float]:
    """abs = |Q_p(samples) - Q_p^true|, rel = abs / |Q_p^true| (spec §8, Q99 errors)."""
    err = abs(float(np.quantile(np.asarray(samples, dtype=np.float64), p)) - true_quantile)
    return {"abs": err, "rel": err / abs(true_quantile)}


def _signed_log1p(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """log1p on x >= 0, extended as the odd function sign(x) log1p(|x|) so that negative samples of Gaussian or
    Student-t decoders do not turn log1p into NaN."""
    return np.sign(x) * np.log1p(np.abs(x))


def _pairs(d: int) -> list[tuple[int, int]]:
    return list(combinations(range(d), 2))


def _subsample_rows(x: NDArray[np.float64], max_rows: int, seed: int) -> NDArray[np.float64]:
    if len(x) <= max_rows:
        return x
    return x[np.random.default_rng(seed).choice(len(x), size=max_rows, replace=False)]


def _kendall_taus(x: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.array([stats.kendalltau(x[:, i], x[:, j]).statistic for i, j in _pairs(x.shape[1])])


def _coexceedance(x: NDArray[np.float64], thresholds: NDArray[np.float64]) -> NDArray[np.float64]:
    """p_ij = P(X_i > t_i, X_j > t_j) for every pair i < j (spec §8)."""
    above = x > thresholds
    return np.array([np.mean(above[:, i] & above[:, j]) for i, j in _pairs(x.shape[1])])


def dependence_metrics(
    real: ArrayLike,
    gen: ArrayLike,
    qs: tuple[float, ...] = (0.95, 0.97, 0.99),
    tau_max_rows: int = 5000,
    seed: int = 0,
) -> dict[str, float]:
    """Cross-dimensional dependence errors of generated rows against real rows (spec §8).

    - corr_log1p_frobenius: ||corr(log1p real) - corr(log1p gen)||_F (log1p extended to negative
      values as sign(x) log1p(|x|));
    - kendall_tau_mae: mean over pairs of |tau_real - tau_gen|, scipy.stats.kendalltau on at most
      `tau_max_rows` rows of each set, drawn without replacement with the fixed `seed` (equal inputs
      give equal subsamples);
    - for each q: coexc_abs_err@q = mean over pairs |p_gen - p_real|, coexc_real@q and coexc_gen@q
      the mean p, with thresholds Q_i(q) from the REAL data only.
    """
    real = np.asarray(real, dtype=np.float64)
    gen = np.asarray(gen, dtype=np.float64)
    if real.ndim != 2 or gen.ndim != 2 or real.shape[1] != gen.shape[1] or real.shape[1] < 2:
        raise ValueError(f"need two (n, D) arrays with the same D >= 2, got {real.shape} and {gen.shape}")
    corr_diff = np.corrcoef(_signed_log1p(real), rowvar=False) - np.corrcoef(_signed_log1p(gen), rowvar=False)
    tau_real = _kendall_taus(_subsample_rows(real, tau_max_rows, seed))
    tau_gen = _kendall_taus(_subsample_rows(gen, tau_max_rows, seed))
    out = {
        "corr_log1p_frobenius": float(np.linalg.norm(corr_diff, "fro")),
        "kendall_tau_mae": float(np.mean(np.abs(tau_real - tau_gen))),
    }
    for q in qs:
        thresholds = np.quantile(real, q, axis=0)
        p_real, p_gen = _coexceedance(real, thresholds), _coexceedance(gen, thresholds)
        out[f"coexc_abs_err@{q:g}"] = float(np.mean(np.abs(p_gen - p_real)))
        out[f"coexc_real@{q:g}"] = float(np.mean(p_real))
        out[f"coexc_gen@{q:g}"] = float(np.mean(p_gen))
    return out


def tail_summary(
    samples: ArrayLike,
    truth: rv_frozen | None,
    reference: ArrayLike | None = None,
    q: float = 0.95,
    min_tail: int = 200,
) -> dict[str, float]:
    """Marginal tail metrics of one coordinate: ks_tail@q, q99/q95 abs and rel errors, neg_frac.

    With a true law the quantiles and the CDF are its own and `reference` is not used; with truth
    None they come from the held-out `reference` data (spec §8, real data).
    """
    if truth is not None:
        cdf, ppf = truth.cdf, truth.ppf
    elif reference is not None:
        cdf, ppf = _empirical_law(reference)
    else:
        raise ValueError("tail_summary needs a true law or reference data")
    x = np.asarray(samples, dtype=np.float64)
    q99 = quantile_error(x, 0.99, float(ppf(0.99)))
    q95 = quantile_error(x, 0.95, float(ppf(0.95)))
    return {
        f"ks_tail@{q:g}": ks_tail(x, q, cdf, ppf, min_tail),
        "q99_abs": q99["abs"],
        "q99_rel": q99["rel"],
        "q95_abs": q95["abs"],
        "q95_rel": q95["rel"],
        "neg_frac": float(np.mean(x < 0)),
    }
