"""Metrics of spec §8: open-set AUROC and FPR@95TPR (higher score = more known), average accuracy
(CGLB's AP) and average forgetting (CGLB's sign: negative = forgetting) of an accuracy matrix."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def auroc(known: np.ndarray, unknown: np.ndarray) -> float:
    """P(score of a known > score of an unknown) + ½ P(tie): the Mann-Whitney form of the ROC area."""
    known, unknown = np.asarray(known, float), np.asarray(unknown, float)
    if not len(known) or not len(unknown):
        raise ValueError(f"AUROC needs knowns and unknowns; got {len(known)} and {len(unknown)}")
    ranks = rankdata(np.concatenate([known, unknown]))
    return float((ranks[: len(known)].sum() - len(known) * (len(known) + 1) / 2) / (len(known) * len(unknown)))


def known_threshold(known: np.ndarray, tpr: float) -> float:
    """The largest threshold that accepts (score >= threshold) at least `tpr` of the knowns."""
    ordered = np.sort(np.asarray(known, float))[::-1]
    return float(ordered[int(np.ceil(tpr * len(ordered))) - 1])


def fpr_at_tpr(known: np.ndarray, unknown: np.ndarray, tpr: float) -> float:
    """Fraction of unknowns accepted at the threshold that accepts `tpr` of the knowns."""
    return float(np.mean(np.asarray(unknown, float) >= known_threshold(known, tpr)))


def average_accuracy(acc: np.ndarray) -> float:
    """AA = (1/K) Σ_j a_{K,j} for the lower-triangular matrix acc[t, j] (stage t, task j)."""
    return float(np.mean(acc[-1]))


def average_forgetting(acc: np.ndarray) -> float:
    """AF = (1/(K−1)) Σ_{j<K} (a_{K,j} − a_{j,j})."""
    k = acc.shape[0]
    return float(np.mean([acc[-1, j] - acc[j, j] for j in range(k - 1)]))
