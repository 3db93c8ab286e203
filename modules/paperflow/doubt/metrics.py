"""Detection metrics (spec section 8): positive class = hallucination (ans0 wrong), ranked by a score where higher
means more likely wrong; detection accuracy at the method's fixed threshold; bootstrap and sub-sampling spreads."""

from __future__ import annotations

import numpy as np


def auroc(wrong: np.ndarray, score: np.ndarray) -> float:
    """AUROC of `score` for the positives `wrong` (Mann-Whitney U with midranks for ties; equals
    sklearn.metrics.roc_auc_score). NaN when one class is empty."""
    wrong = np.asarray(wrong, dtype=bool)
    n1, n0 = int(wrong.sum()), int((~wrong).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(np.asarray(score, dtype=float))
    return float((ranks[wrong].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def detection_accuracy(wrong: np.ndarray, flagged: np.ndarray) -> float:
    """Share of items where (flagged as hallucination AND wrong) or (trusted AND correct) (the code's protocol)."""
    wrong, flagged = np.asarray(wrong, dtype=bool), np.asarray(flagged, dtype=bool)
    return float(np.mean(wrong == flagged))


def bootstrap_auroc_diff(wrong, score_a, score_b, reps: int, seed: int) -> tuple[float, float, float]:
    """AUROC(a) - AUROC(b) on the same items, with the 2.5% and 97.5% quantiles of a paired item bootstrap."""
    wrong = np.asarray(wrong, dtype=bool)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(reps):
        idx = rng.integers(len(wrong), size=len(wrong))
        d = auroc(wrong[idx], score_a[idx]) - auroc(wrong[idx], score_b[idx])
        if np.isfinite(d):
            diffs.append(d)
    point = auroc(wrong, score_a) - auroc(wrong, score_b)
    lo, hi = np.quantile(diffs, [0.025, 0.975]) if diffs else (np.nan, np.nan)
    return float(point), float(lo), float(hi)
