"""The smoke stand-in of spec section 4: a polarity-counting classifier, pretrained on a source task, fine-tuned
on a target task whose signal sits in six flipped tokens (so the fine-tuning gradient is near low-rank).

An input is BOS, 12 content tokens (0-29), SEP; the model predicts a label word (YES/NO) at SEP. Source: tokens
0-9 positive, 10-19 negative, 20-29 neutral, label = sign(#pos - #neg) (ties resampled). Target: the polarity of
tokens 0, 1, 2 and 10, 11, 12 flipped. Generated with numpy from a seed; nothing is downloaded. numpy only here,
so the download and preprocess stages start without torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_CONTENT = 30
BOS, SEP, YES, NO = 30, 31, 32, 33
VOCAB_SIZE = 34
LABEL_WORDS = (NO, YES)  # class 0 = NO, class 1 = YES: logits[:, LABEL_WORDS] are the two class scores
TASKS = ("source", "target")
FLIPPED = (0, 1, 2, 10, 11, 12)


def polarity(task: str, flipped: Sequence[int] = FLIPPED) -> np.ndarray:
    """Polarity (+1, -1, 0) of each content token under `task`."""
    if task not in TASKS:
        raise ValueError(f"task {task!r}: choose one of {TASKS}")
    pol = np.zeros(N_CONTENT, dtype=np.int64)
    pol[0:10], pol[10:20] = 1, -1
    if task == "target":
        pol[list(flipped)] *= -1
    return pol


def generate(task: str, n: int, rng: np.random.Generator, length: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """`n` examples of `task`: ids (n, length + 2) = BOS, content, SEP; labels (n,), 1 where #pos > #neg.
    Rows whose score ties are drawn again."""
    pol = polarity(task)
    content = rng.integers(0, N_CONTENT, size=(n, length))
    score = pol[content].sum(1)
    while (tie := score == 0).any():
        content[tie] = rng.integers(0, N_CONTENT, size=(int(tie.sum()), length))
        score[tie] = pol[content[tie]].sum(1)
    ids = np.concatenate([np.full((n, 1), BOS), content, np.full((n, 1), SEP)], axis=1)
    return ids.astype(np.int64), (score > 0).astype(np.int64)


def label_of(task: str, ids: np.ndarray) -> np.ndarray:
    """The label `task` gives to encoded rows (checks a split against its task)."""
    score = polarity(task)[ids[:, 1:-1]].sum(1)
    return (score > 0).astype(np.int64)


SPLITS = {"train": "target", "dev": "target", "test": "target", "source_test": "source"}


def make_splits(sizes: dict[str, int], seed: int, length: int = 12) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The fixed splits (spec 4: target train/dev/test 1000/500/1000, and a source test set for the pretraining
    check), each from its own generator derived from `seed`, so changing one size leaves the others as they were."""
    out = {}
    for i, (split, task) in enumerate(SPLITS.items()):
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), i]))
        out[split] = generate(task, int(sizes[split]), rng, length)
    return out


def to_words(ids: np.ndarray) -> list[str]:
    """Rows of ids as the raw text the download stage writes ("t3 t17 ..."; BOS/SEP are the template's)."""
    return [" ".join(f"t{i}" for i in row[1:-1]) for row in ids]


def from_words(texts: Sequence[str]) -> np.ndarray:
    """The template (BOS, content, SEP) applied to raw text rows."""
    rows = [[BOS, *(int(w[1:]) for w in text.split()), SEP] for text in texts]
    return np.asarray(rows, dtype=np.int64)
