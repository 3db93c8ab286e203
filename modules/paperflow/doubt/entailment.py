"""Semantic entropy's bidirectional-entailment clusterer at paper scale (Kuhn et al. 2023; Farquhar et al. 2024):
two answers share a meaning iff an NLI model says each entails the other (the original: DeBERTa-large-MNLI on
"question answer" pairs). Per item, the judge decides every pair of the item's distinct answers once; the
equivalence matrix is stored, so that every size-n subset is clustered by the same greedy procedure as the smoke
scale (`scores.greedy_clusters`: a sample joins the first cluster whose first member it matches) and scored by the
discrete entropy over cluster frequencies (`scores.semantic_entropy`, log2: the models' answers come without
their likelihoods here, so the discrete variant of Farquhar et al.)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# premise, hypothesis pairs -> one bool each: does the premise entail the hypothesis
PairJudge = Callable[[list[tuple[str, str]]], list[bool]]


def equivalence(answers: Sequence[str], judge: PairJudge) -> np.ndarray:
    """[k, k] bidirectional entailment of k distinct answers: same[a, b] iff a entails b and b entails a. Equal
    strings are equivalent without asking the judge; each ordered pair of distinct strings is asked once."""
    k = len(answers)
    pairs = [(answers[a], answers[b]) for a in range(k) for b in range(k) if a != b]
    verdict = dict(zip(pairs, judge(pairs))) if pairs else {}
    same = np.eye(k, dtype=bool)
    for a in range(k):
        for b in range(a + 1, k):
            same[a, b] = same[b, a] = bool(verdict[(answers[a], answers[b])] and verdict[(answers[b], answers[a])])
    return same


def clusters(answers: Sequence[str], judge: PairJudge) -> list[int]:
    """Cluster ids of a list of answers (repeats allowed) by bidirectional entailment, greedy in sample order."""
    from paperflow.doubt.scores import greedy_clusters

    distinct = sorted(set(answers))
    index = {a: i for i, a in enumerate(distinct)}
    return greedy_clusters([index[a] for a in answers], equivalence(distinct, judge))


def entailment_label(id2label: Mapping[Any, str]) -> int:
    """The class index of "entailment" in an NLI model's id2label (MNLI heads order their labels differently)."""
    hits = [int(i) for i, name in id2label.items() if str(name).lower().startswith("entail")]
    if len(hits) != 1:
        raise ValueError(f"the NLI model's id2label {dict(id2label)} has no single 'entailment' class")
    return hits[0]


class NLIJudge:
    """An NLI sequence classifier as a `PairJudge`: the premise entails the hypothesis iff the argmax class is
    entailment (Kuhn et al.'s strict criterion), in batches of `batch_size` pairs, `prefix` (the question and a
    space, Kuhn et al.) put before both texts."""

    def __init__(self, model, tokenizer, device, batch_size: int, prefix: str = ""):
        self.model, self.tok, self.device, self.batch_size, self.prefix = model, tokenizer, device, batch_size, prefix
        self.entail = entailment_label(model.config.id2label)

    def __call__(self, pairs: list[tuple[str, str]]) -> list[bool]:
        import torch

        out: list[bool] = []
        for start in range(0, len(pairs), self.batch_size):
            batch = pairs[start : start + self.batch_size]
            enc = self.tok(
                [self.prefix + p for p, _ in batch],
                [self.prefix + h for _, h in batch],
                return_tensors="pt",
                padding=True,
                truncation=True,
            ).to(self.device)
            with torch.inference_mode():
                logits = self.model(**enc).logits
            out += (logits.argmax(dim=-1) == self.entail).tolist()
        return out


def load_nli(folder: str, device, dtype: str = "float32"):
    """(model, tokenizer) of a pinned NLI snapshot, offline."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(
        folder, local_files_only=True, dtype=getattr(torch, dtype)
    ).to(device)
    return model.eval(), tok
