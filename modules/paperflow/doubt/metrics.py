"""Detection metrics (spec section 8): positive class = hallucination (ans0 wrong), ranked by a score where higher
means more likely wrong; detection accuracy at the method's fixed threshold; per-item AUROC pseudo-values for claims paired by item."""

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


def auroc_pseudo_values(wrong: np.ndarray, score: np.ndarray) -> np.ndarray:
    """Per item, a value whose mean over the items is the AUROC, so that AUROCs can be compared paired by item and
    resampled item by item (the claims' two-level bootstrap over seeds, then items). An item's placement is the share
    of the other class it outranks (a positive: of the negatives scored below it; a negative: of the positives scored
    above it; ties count 1/2): the mean placement of each class is the AUROC (DeLong et al. 1988's structural
    components). The pseudo-value is AUROC + (N / n_class)(placement - AUROC): its mean is the AUROC exactly, and the
    variance of its mean over items drawn with replacement is var(placements of positives) / n1 + var(of negatives)
    / n0, DeLong's variance of the AUROC (tested). NaN when one class is empty or a score is missing."""
    wrong = np.asarray(wrong, dtype=bool)
    score = np.asarray(score, dtype=float)
    n1, n0 = int(wrong.sum()), int((~wrong).sum())
    if n1 == 0 or n0 == 0 or not np.isfinite(score).all():
        return np.full(len(wrong), np.nan)
    pos, neg = score[wrong], score[~wrong]
    neg_sorted, pos_sorted = np.sort(neg), np.sort(pos)
    below = np.searchsorted(neg_sorted, pos, "left") + 0.5 * (
        np.searchsorted(neg_sorted, pos, "right") - np.searchsorted(neg_sorted, pos, "left")
    )
    above = (n1 - np.searchsorted(pos_sorted, neg, "right")) + 0.5 * (
        np.searchsorted(pos_sorted, neg, "right") - np.searchsorted(pos_sorted, neg, "left")
    )
    placement = np.empty(len(wrong))
    placement[wrong], placement[~wrong] = below / n0, above / n1
    area = float(placement[wrong].mean())
    share = np.where(wrong, len(wrong) / n1, len(wrong) / n0)
    return area + share * (placement - area)


def detection_accuracy(wrong: np.ndarray, flagged: np.ndarray) -> float:
    """Share of items where (flagged as hallucination AND wrong) or (trusted AND correct) (the code's protocol)."""
    wrong, flagged = np.asarray(wrong, dtype=bool), np.asarray(flagged, dtype=bool)
    return float(np.mean(wrong == flagged))
