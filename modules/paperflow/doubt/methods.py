"""The detectors compared (spec section 3, ablations included) on sampled answer sets: each maps a seed's answer
sets (as ids into the table of distinct embedded strings) to a per-item hallucination score (higher = more
likely wrong) and, where the method has an official threshold, a flag. Sub-sampling draws the same size-n subsets
for every method (seeded by seed, n and repetition), and the same indices in A and B."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from paperflow.doubt import scores

TRUST_THRESHOLD = 0.48  # DOUBT / vMF: trustworthy iff score > 0.48 (official run script)
SE_THRESHOLD = 1.0  # SE: hallucination iff U >= 1.0 (log2 entropy; VL-Uncertainty)


@dataclass(frozen=True)
class Method:
    name: str
    sets: tuple[str, ...]  # "A" (plain), "B" (object-first) or both
    statistic: str  # rbar | rbar_nodebias | se | se_exact | eigenscore | lexical
    description: str


METHODS = {
    m.name: m
    for m in (
        Method("doubt", ("A", "B"), "rbar", "DOUBT: 0.5 Rbar(A) + 0.5 Rbar(B), centred MiniLM embeddings"),
        Method("vmf_plain", ("A",), "rbar", "vMF Rbar on the plain set only (no OUB)"),
        Method("vmf_oub", ("B",), "rbar", "vMF Rbar on the OUB set only"),
        Method("vmf_plain_nodebias", ("A",), "rbar_nodebias", "vMF Rbar on the plain set only, debias (centring) off"),
        Method("doubt_nodebias", ("A", "B"), "rbar_nodebias", "DOUBT with debias (centring) off"),
        Method("se_plain", ("A",), "se", "semantic entropy, MiniLM-cosine clusterer, plain set"),
        Method("se_exact", ("A",), "se_exact", "entropy over exact answer strings (categorical clusters)"),
        Method("se_oub", ("B",), "se", "semantic entropy on the OUB set"),
        Method("oub_se", ("A", "B"), "se", "OUB + SE: mean of the two sets' semantic entropies"),
        Method("eigenscore", ("A",), "eigenscore", "EigenScore (INSIDE) of the plain set's embeddings"),
        Method("lexical", ("A",), "lexical", "mean pairwise ROUGE-L of the plain set (negated)"),
    )
}


def subsets(seed: int, n: int, n_max: int, reps: int) -> list[np.ndarray]:
    """The sample indices scored at size n: all of them once when n = n_max, else `reps` random size-n subsets."""
    if n == n_max:
        return [np.arange(n_max)]
    rng = np.random.default_rng([seed, n, 7])
    return [np.sort(rng.choice(n_max, size=n, replace=False)) for _ in range(reps)]


class Scorer:
    """The per-set statistics over one table of distinct strings: unit embeddings, the semantic judge, the words."""

    def __init__(
        self, strings: Sequence[str], embeddings: np.ndarray, judge_threshold: float, same: np.ndarray | None = None
    ):
        self.strings = list(strings)
        self.emb = np.asarray(embeddings, dtype=np.float64)
        unit = self.emb / np.linalg.norm(self.emb, axis=1, keepdims=True)
        # the semantic judge: MiniLM cosine above the threshold, or a given equivalence (paper scale: entailment)
        self.same = scores.cosine_judge(unit, judge_threshold) if same is None else np.asarray(same, dtype=bool)
        self.gram = self.emb @ self.emb.T
        self._rouge: np.ndarray | None = None
        self._memo: dict[tuple, float] = {}

    def per_set(self, statistic: str, ids: np.ndarray) -> np.ndarray:
        """[items] statistic of each row of `ids` [items, n] (Rbar: consistency; SE, EigenScore: spread)."""
        if statistic in ("rbar", "rbar_nodebias"):
            return scores.rbar_gram_batch(self.gram[ids[:, :, None], ids[:, None, :]], debias=statistic == "rbar")
        if statistic == "lexical":
            if self._rouge is None:
                self._rouge = scores.rouge_matrix(self.strings)
            return scores.mean_pairwise(self._rouge, ids)
        fn: Callable[[tuple], float] = {
            "se": lambda t: scores.semantic_entropy(scores.greedy_clusters(t, self.same)),
            "se_exact": lambda t: scores.semantic_entropy(list(t)),
            "eigenscore": lambda t: scores.eigenscore(self.emb[list(t)]),
        }[statistic]
        out = np.empty(len(ids))
        for k, row in enumerate(ids):
            key = (statistic, *row.tolist())
            if key not in self._memo:
                self._memo[key] = fn(tuple(row.tolist()))
            out[k] = self._memo[key]
        return out

    def largest_cluster(self, ids: np.ndarray) -> np.ndarray:
        """Size of each set's largest semantic cluster (C3's "agrees at least 8/10")."""
        return np.array([np.bincount(scores.greedy_clusters(row.tolist(), self.same)).max() for row in ids])


def score(method: Method, sets: Mapping[str, np.ndarray], scorer: Scorer) -> tuple[np.ndarray, np.ndarray]:
    """(hallucination score, flag) per item from the sets' ids [items, n] (NaN flags: no official threshold)."""
    values = np.mean([scorer.per_set(method.statistic, sets[s]) for s in method.sets], axis=0)
    if method.statistic.startswith("rbar"):
        return -values, values <= TRUST_THRESHOLD
    if method.statistic.startswith("se"):
        return values, values >= SE_THRESHOLD
    if method.statistic == "lexical":
        return -values, np.full(len(values), np.nan)
    return values, np.full(len(values), np.nan)


def score_seed(
    method: Method, seed: int, sets: Mapping[str, np.ndarray], scorer: Scorer, ns: Sequence[int], reps: int
) -> pd.DataFrame:
    """Long table (seed, n, rep, item, score, flag) of one method on one seed's answer sets."""
    n_max = next(iter(sets.values())).shape[1]
    frames = []
    for n in ns:
        for rep, idx in enumerate(subsets(seed, n, n_max, reps)):
            s, f = score(method, {k: v[:, idx] for k, v in sets.items()}, scorer)
            frames.append(
                pd.DataFrame(
                    {"seed": seed, "n": n, "rep": rep, "item": np.arange(len(s)), "score": s, "flag": f.astype(float)}
                )
            )
    return pd.concat(frames, ignore_index=True)
