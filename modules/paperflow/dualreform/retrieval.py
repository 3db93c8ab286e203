"""BM25 over the passage corpus (bm25s, Robertson's BM25, whitespace tokens) and the retrieval metrics
of spec section 8 for one relevant passage per turn.

Ties in score (an elliptic query such as "and its founding" matches every founding passage equally) are
broken by a fixed random order of the passages drawn from `tiebreak_seed`, never by passage id, so that no
entity is favoured by where it sits in the corpus. Ranks are 1-based over the whole corpus.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class BM25Index:
    """bm25s's Robertson BM25 (k1, b) over whitespace-split passages."""

    def __init__(self, texts: Sequence[str], k1: float, b: float, tiebreak_seed: int):
        import bm25s

        self.n_docs = len(texts)
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="robertson")
        self._bm25.index([t.split() for t in texts], show_progress=False)
        # secondary sort key: a fixed random permutation, scaled below the smallest score gap
        self._tiebreak = np.random.default_rng(tiebreak_seed).permutation(self.n_docs).astype(np.float64)

    def scores(self, queries: Sequence[str]) -> np.ndarray:
        """BM25 scores [n_queries, n_docs] (float64); an empty query scores 0 everywhere (the fixed order ranks)."""
        out = np.zeros((len(queries), self.n_docs), dtype=np.float64)
        for i, q in enumerate(queries):
            if q.split():
                out[i] = self._bm25.get_scores(q.split())
        return out

    def _order(self, scores: np.ndarray) -> np.ndarray:
        # lexsort: last key is primary -> by score descending, then by the fixed random order
        tb = np.broadcast_to(self._tiebreak, scores.shape)
        return np.lexsort((tb, -scores), axis=-1)

    def rankings(self, queries: Sequence[str], k: int) -> np.ndarray:
        """The top-k passage ids of each query [n_queries, k], best first."""
        return self._order(self.scores(queries))[:, :k]

    def rank_of(self, queries: Sequence[str], pids: Sequence[int]) -> np.ndarray:
        """The 1-based rank of passage pids[i] in the ranking of queries[i]."""
        order = self._order(self.scores(queries))
        pids = np.asarray(pids)
        return (order == pids[:, None]).argmax(axis=1) + 1

    def top1(self, queries: Sequence[str]) -> np.ndarray:
        """The best passage of each query (a pseudo reference, spec section 2 step 3)."""
        return self.rankings(queries, 1)[:, 0]


def retrieval_metrics(ranks: np.ndarray, depth: int = 100) -> dict[str, float]:
    """Spec section 8 with one relevant passage per turn, from its 1-based ranks: MRR over the top `depth`,
    nDCG@3 (binary gain, as trec_eval's ndcg_cut_3), Recall@10 and Recall@100; means over turns."""
    ranks = np.asarray(ranks, dtype=np.float64)
    found = ranks <= depth
    return {
        "mrr": float(np.mean(np.where(found, 1.0 / ranks, 0.0))),
        "ndcg@3": float(np.mean(np.where(ranks <= 3, 1.0 / np.log2(ranks + 1.0), 0.0))),
        "recall@10": float(np.mean(ranks <= 10)),
        "recall@100": float(np.mean(ranks <= 100)),
    }
