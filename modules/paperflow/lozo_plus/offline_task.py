"""A prompt classification task built offline for the cpu-scale fine-tuning of a real pretrained model (issue 52):
movie-review sentences in GLUE SST-2's schema (`sentence`, `label`: 0 negative, 1 positive, `idx`), so that MeZO's
SST-2 template ("<sentence> It was" + " terrible" / " great"), its sampling and the paper-scale preprocessing apply
unchanged. No SST-2 copy ships in any installed package and nothing downloads here, so the sentences come from a
seeded generator over small word lists.

Four sentence shapes, each with its share (`SHAPES`): a plain verdict ("the plot is gripping."), a negated one
("the plot is not gripping.", the label flips), a contrast whose second clause decides ("the cast is charming, but
the script is tedious.") and two clauses that agree. A pretrained model reads the plain and agreeing shapes from
the adjective alone; the negated and contrast shapes are where fine-tuning has room. numpy and pandas only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError

SUBJECTS = (
    "the film",
    "the plot",
    "the acting",
    "the soundtrack",
    "the dialogue",
    "the ending",
    "the cast",
    "the script",
    "the pacing",
    "the camera work",
)
POSITIVE = ("superb", "moving", "delightful", "clever", "gripping", "charming", "brilliant", "warm", "funny", "lovely")
NEGATIVE = ("dull", "clumsy", "tedious", "shallow", "predictable", "bland", "messy", "boring", "lifeless", "awful")
SHAPES = {"plain": 0.3, "negated": 0.25, "contrast": 0.3, "agree": 0.15}
GENERATORS = ("reviews",)
SPLIT_STREAMS = {"train": 0, "validation": 1}  # each HF split draws from its own stream of the task's seed


def _adjective(rng: np.random.Generator, positive: bool) -> str:
    words = POSITIVE if positive else NEGATIVE
    return words[int(rng.integers(len(words)))]


def review(rng: np.random.Generator) -> tuple[str, int, str]:
    """(sentence, label, shape) of one generated review."""
    shape = str(rng.choice(list(SHAPES), p=np.array(list(SHAPES.values()))))
    first, second = (SUBJECTS[i] for i in rng.choice(len(SUBJECTS), size=2, replace=False))
    polarity = bool(rng.integers(2))
    if shape == "plain":
        text, label = f"{first} is {_adjective(rng, polarity)}.", polarity
    elif shape == "negated":
        text, label = f"{first} is not {_adjective(rng, polarity)}.", not polarity
    elif shape == "contrast":
        text = f"{first} is {_adjective(rng, not polarity)}, but {second} is {_adjective(rng, polarity)}."
        label = polarity
    else:
        text = f"{first} is {_adjective(rng, polarity)} and {second} is {_adjective(rng, polarity)}."
        label = polarity
    return text[0].upper() + text[1:], int(label), shape


def split_frame(generator: str, rows: int, seed: int, split: str) -> pd.DataFrame:
    """`rows` generated reviews of one HF-style split (`train` or `validation`), in SST-2's columns plus `shape`."""
    if generator not in GENERATORS:
        raise ConfigError(f"pretrained_cpu.task.generator: {generator!r} is not one of {list(GENERATORS)}")
    if split not in SPLIT_STREAMS:
        raise ConfigError(f"split {split!r} is not one of {list(SPLIT_STREAMS)}")
    rng = np.random.default_rng([int(seed), SPLIT_STREAMS[split]])
    drawn = [review(rng) for _ in range(int(rows))]
    return pd.DataFrame(
        {
            "sentence": [d[0] for d in drawn],
            "label": np.array([d[1] for d in drawn], dtype=np.int64),
            "idx": np.arange(len(drawn), dtype=np.int64),
            "shape": [d[2] for d in drawn],
        }
    )


def generate(task: Mapping[str, object]) -> dict[str, pd.DataFrame]:
    """Both splits of the task config (`generator`, `seed`, `train_rows`, `validation_rows`)."""
    return {
        split: split_frame(str(task["generator"]), int(task[f"{split}_rows"]), int(task["seed"]), split)
        for split in SPLIT_STREAMS
    }
