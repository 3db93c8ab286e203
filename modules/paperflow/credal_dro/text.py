"""Demographically shifted text classification (spec §4): corpus, frozen sentence embedding, linear heads.

Offline stand-in: template comments that mention one of 8 identities and carry a toxic, a civil or an
uninformative phrase; in the training law the identity is correlated with the label, in the test law
it is not (worst-slice degradation). Paper scale: CivilComments (WILDS v1.0). The embedding is in
`encode` (scverse env), the heads in `heads` (torch env); this module needs numpy and pandas only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

IDENTITIES = ["male", "female", "LGBTQ", "christian", "muslim", "other_religions", "black", "white"]
MENTIONS = [
    "a man",
    "a woman",
    "a gay person",
    "a christian",
    "a muslim",
    "a jewish person",
    "a black person",
    "a white person",
]
TOXIC = [
    "is a disgusting idiot",
    "should shut up and die",
    "is a worthless stupid pig",
    "is pathetic trash",
    "is a moron who ruins everything",
    "deserves to be insulted",
    "is an ugly loser",
    "is a filthy liar",
]
CIVIL = [
    "made a thoughtful point",
    "was kind to the neighbours",
    "wrote a helpful comment",
    "is a respected teacher",
    "gave a fair answer",
    "shared an interesting story",
    "is a good friend",
    "helped at the food bank",
]
NEUTRAL = [
    "was mentioned in the article",
    "commented on the story",
    "replied to the thread",
    "posted yesterday",
    "was in the news",
    "wrote something about this",
    "was quoted here",
    "responded to the column",
]
TEMPLATES = [
    "I think {who} {what}.",
    "Honestly, {who} {what}",
    "Everyone knows {who} {what}!",
    "Apparently {who} {what}.",
]


def synthetic_comments(
    n: int, ambiguous: float, spurious: float, rng: np.random.Generator, correlated: bool
) -> pd.DataFrame:
    """n comments; label 1 (toxic) with group-dependent rate (`spurious` or 1 - spurious for alternating
    identities when `correlated`, else 0.5); the content phrase is uninformative with prob `ambiguous`."""
    group = rng.integers(0, len(IDENTITIES), n)
    rate = np.where(group % 2 == 0, spurious, 1 - spurious) if correlated else np.full(n, 0.5)
    label = (rng.random(n) < rate).astype(int)
    pools = np.where(rng.random(n) < ambiguous, 2, 1 - label)  # 0 toxic, 1 civil, 2 neutral
    phrases = [TOXIC, CIVIL, NEUTRAL]
    texts = [
        TEMPLATES[rng.integers(len(TEMPLATES))].format(who=MENTIONS[g], what=phrases[p][rng.integers(8)])
        for g, p in zip(group, pools)
    ]
    return pd.DataFrame({"text": texts, "label": label, "group": group})


def read_civilcomments(csv_path: str) -> pd.DataFrame:
    """WILDS CivilComments (all_data_with_identities.csv): label = toxicity >= 0.5, group = first
    identity with score >= 0.5 (or -1), split as in WILDS."""
    frame = pd.read_csv(csv_path, usecols=["comment_text", "toxicity", "split", *IDENTITIES])
    ids = frame[IDENTITIES].fillna(0).to_numpy() >= 0.5
    group = np.where(ids.any(axis=1), ids.argmax(axis=1), -1)
    return pd.DataFrame(
        {
            "text": frame["comment_text"].fillna("").astype(str),
            "label": (frame["toxicity"] >= 0.5).astype(int),
            "group": group,
            "split": frame["split"],
        }
    )


def slice_accuracy(scores: np.ndarray, label: np.ndarray, group: np.ndarray) -> dict[str, float]:
    """Average accuracy and worst accuracy over the identity x label slices present."""
    correct = (scores > 0).astype(int) == label
    accs = [
        correct[(group == g) & (label == y)].mean()
        for g in np.unique(group[group >= 0])
        for y in (0, 1)
        if ((group == g) & (label == y)).any()
    ]
    return {"avg_acc": float(correct.mean()), "worst_slice_acc": float(min(accs))}
