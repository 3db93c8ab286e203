"""Uncertainty scores of an answer set (spec sections 2, 3, 11). Every function takes one set; the `*_batch`
forms take [items, n, d] arrays. Polarity: `hallucination_score` turns each into "higher = more likely wrong"
(DOUBT and the vMF scores flag LOW Rbar, SE flags HIGH entropy; spec section 9)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEGENERATE_TOL = 1e-6  # spec section 9: centred rows this small mean an all-identical set, Rbar := 1


def rbar_batch(emb: np.ndarray, debias: bool = True) -> np.ndarray:
    """Mean resultant length per set, emb [items, n, d] -> [items] (spec section 2): centre per set (debias),
    unit-normalise each row (+1e-12), ||sum_i X_i|| / n, rounded to 1e-10. A set whose centred rows are all below 1e-6 is
    all-identical and gets Rbar = 1 (spec section 9). Computed in float64 whatever the input dtype, so float32
    rounding in the mean cannot leave a residual above the tolerance."""
    emb = np.asarray(emb, dtype=np.float64)
    if emb.ndim != 3:
        raise ValueError(f"embeddings must be [items, n, d], got shape {emb.shape}")
    e = emb - emb.mean(axis=1, keepdims=True) if debias else emb
    norms = np.linalg.norm(e, axis=2, keepdims=True)
    x = e / (norms + 1e-12)
    r = np.linalg.norm(x.sum(axis=1), axis=1) / emb.shape[1]
    degenerate = norms.max(axis=(1, 2)) < DEGENERATE_TOL
    # rounded to 1e-10: equal answer-count patterns give equal scores (exact ties for AUROC), not float noise
    return np.round(np.where(degenerate, 1.0, r), 10)


def rbar_gram_batch(gram: np.ndarray, debias: bool = True) -> np.ndarray:
    """`rbar_batch` from each set's Gram matrix [items, n, n] of raw embeddings (K_ij = <emb_i, emb_j>): centring is
    K - row means - column means + grand mean, and ||sum_i e_i / ||e_i|| ||^2 = sum_ij G_ij / (||e_i|| ||e_j||).
    The same number as the direct form (tested to 1e-9) at n^2 instead of n d operations per set."""
    k = np.asarray(gram, dtype=np.float64)
    if debias:
        k = k - k.mean(axis=1, keepdims=True) - k.mean(axis=2, keepdims=True) + k.mean(axis=(1, 2), keepdims=True)
    norms = np.sqrt(np.clip(np.diagonal(k, axis1=1, axis2=2), 0, None))
    inv = 1.0 / (norms + 1e-12)
    r2 = np.einsum("bij,bi,bj->b", k, inv, inv)
    # r2 below 1e-12 is rounding noise of an (almost) symmetric set whose Rbar < 1e-6: 0, as the direct form gives
    r = np.sqrt(np.where(r2 < 1e-12, 0.0, r2)) / k.shape[1]
    degenerate = norms.max(axis=1) < DEGENERATE_TOL
    return np.round(np.where(degenerate, 1.0, r), 10)


def rbar(emb: np.ndarray, debias: bool = True) -> float:
    return float(rbar_batch(np.asarray(emb)[None], debias)[0])


def doubt_score(r_plain: np.ndarray, r_oub: np.ndarray) -> np.ndarray:
    """0.5 Rbar(A) + 0.5 Rbar(B): the two sets scored separately, then averaged (never pooled; spec section 9)."""
    return 0.5 * np.asarray(r_plain) + 0.5 * np.asarray(r_oub)


def semantic_entropy(clusters: Sequence[int]) -> float:
    """U = -sum_c (n_c / n) log2(n_c / n) over cluster ids (VL-Uncertainty's formula; -1 is a cluster too)."""
    _, counts = np.unique(np.asarray(clusters), return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def greedy_clusters(ids: Sequence[int], same: np.ndarray) -> list[int]:
    """Greedy clustering in sample order (SE's bidirectional-entailment procedure, with `same[a, b]` the
    symmetric judge): a sample joins the first cluster whose first member it matches, else opens one."""
    reps: list[int] = []
    out = []
    for a in ids:
        for c, r in enumerate(reps):
            if same[a, r]:
                out.append(c)
                break
        else:
            reps.append(a)
            out.append(len(reps) - 1)
    return out


def cosine_judge(unit: np.ndarray, threshold: float) -> np.ndarray:
    """same[a, b] = cos(emb_a, emb_b) > threshold over distinct strings' unit embeddings (the stand-in for the
    LLM entailment judge, spec section 11)."""
    return (unit @ unit.T) > threshold


def choose_threshold(unit: np.ndarray, labels: Sequence[str]) -> tuple[float, float]:
    """The cosine threshold that best separates same-meaning from different-meaning pairs of a dev set:
    (threshold, pair accuracy). Candidates are the midpoints of the sorted pairwise cosines."""
    labels = np.asarray(labels)
    cos = unit @ unit.T
    iu = np.triu_indices(len(labels), 1)
    c, same = cos[iu], (labels[:, None] == labels[None, :])[iu]
    order = np.argsort(c)
    cs, ss = c[order], same[order]
    # predicting "same" for pairs above cut k: correct = different below + same above
    diff_below = np.concatenate([[0], np.cumsum(~ss)])
    same_above = ss.sum() - np.concatenate([[0], np.cumsum(ss)])
    acc = (diff_below + same_above) / len(cs)
    k = int(np.argmax(acc))
    lo = cs[k - 1] if k > 0 else cs[0] - 1e-3
    hi = cs[k] if k < len(cs) else cs[-1] + 1e-3
    return float((lo + hi) / 2), float(acc[k])


def eigenscore(emb: np.ndarray, alpha: float = 1e-3) -> float:
    """INSIDE's EigenScore: mean log eigenvalue of the regularised covariance (Gram form, n x n) of the
    centred sample embeddings; higher = more diverse."""
    e = np.asarray(emb, dtype=np.float64)
    e = e - e.mean(axis=0, keepdims=True)
    gram = e @ e.T / e.shape[1] + alpha * np.eye(e.shape[0])
    return float(np.mean(np.log(np.linalg.eigvalsh(gram))))


def rouge_l(a: Sequence[str], b: Sequence[str]) -> float:
    """ROUGE-L F-measure of two word lists (longest common subsequence)."""
    if not a or not b:
        return float(not a and not b)
    dp = np.zeros((len(a) + 1, len(b) + 1), dtype=int)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            dp[i + 1, j + 1] = dp[i, j] + 1 if x == y else max(dp[i, j + 1], dp[i + 1, j])
    lcs = dp[-1, -1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(b), lcs / len(a)
    return float(2 * p * r / (p + r))


def rouge_matrix(answers: Sequence[str]) -> np.ndarray:
    """Pairwise ROUGE-L F-measures of distinct answers (a set's lexical similarity is the mean of its pairs)."""
    words = [a.split() for a in answers]
    return np.array([[rouge_l(a, b) for b in words] for a in words])


def lexical_similarity(answers: Sequence[str]) -> float:
    """Mean pairwise ROUGE-L over the set; higher = more consistent."""
    words = [a.split() for a in answers]
    pairs = [(i, j) for i in range(len(words)) for j in range(i + 1, len(words))]
    return float(np.mean([rouge_l(words[i], words[j]) for i, j in pairs])) if pairs else 1.0


def mean_pairwise(matrix: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Mean of matrix[a, b] over the pairs a < b of each row of ids [items, n] (the batched lexical similarity)."""
    sub = matrix[ids[:, :, None], ids[:, None, :]]
    n = ids.shape[1]
    iu = np.triu_indices(n, 1)
    return sub[:, iu[0], iu[1]].mean(axis=1)
