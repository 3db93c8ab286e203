"""Chat prompts built offline for the cpu scale's real target (issue 49, `pretrained_cpu`): the draft-training
prompts in the table `paper.download_dataset` writes (dataset, id, prompt) and the test questions in the one
`paper.download_benchmark` writes (question_id, category, task, prompt), so that the paper-scale rules (chat
template, regeneration, draft training, decoding, report) read them unchanged. No ShareGPT, UltraChat or Spec-Bench
copy ships in any installed package and nothing downloads here, so the prompts come from a seeded generator over
small word lists, in six of Spec-Bench's kinds of request (writing, question answering, explanation, lists, arithmetic,
rewriting). The target writes its own answers to them (`paper.regenerate`), as EAGLE-3 and the paper train on.
numpy and pandas only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError

TOPICS = (
    "the ocean",
    "volcanoes",
    "honey bees",
    "the moon",
    "rain forests",
    "bicycles",
    "coffee",
    "libraries",
    "winter",
    "trains",
    "the human heart",
    "clouds",
    "chess",
    "bread",
    "electricity",
    "deserts",
    "owls",
    "music",
    "gardens",
    "mountains",
    "rivers",
    "the internet",
    "dolphins",
    "paper",
    "glass",
    "friendship",
    "maps",
    "salt",
    "bridges",
    "the sun",
)
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo")
THINGS = ("apples", "books", "coins", "pencils", "stamps", "shells", "marbles", "cards")
SENTENCES = (
    "the meeting was moved to friday because the room was booked",
    "our team finished the project two days early and under budget",
    "the weather was so cold that the lake froze overnight",
    "she forgot her umbrella and got wet on the way home",
    "the new bakery on main street sells fresh bread every morning",
    "he practised the piano every evening for a whole year",
)


def _writing(rng, topic):
    return f"Write a short paragraph about {topic}."


def _qa(rng, topic):
    return f"What are the most interesting facts about {topic}?"


def _explain(rng, topic):
    return f"Explain {topic} to a ten-year-old in a few sentences."


def _lists(rng, topic):
    return f"List three things people often do not know about {topic}."


def _math(rng, topic):
    name, thing = NAMES[int(rng.integers(len(NAMES)))], THINGS[int(rng.integers(len(THINGS)))]
    a, b = int(rng.integers(3, 40)), int(rng.integers(2, 30))
    return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now? Explain the steps."


def _rewrite(rng, topic):
    return f"Rewrite this sentence in a formal style: {SENTENCES[int(rng.integers(len(SENTENCES)))]}."


KINDS = {"writing": _writing, "qa": _qa, "explain": _explain, "lists": _lists, "math": _math, "rewrite": _rewrite}
GENERATORS = ("instructions",)
STREAMS = {"train": 0, "test": 1}  # the training prompts and the test questions draw from their own streams


def prompts(generator: str, rows: int, seed: int, split: str) -> pd.DataFrame:
    """`rows` prompts of `split` (train | test): columns kind, prompt. The kinds cycle, each row's topic is drawn."""
    if generator not in GENERATORS:
        raise ConfigError(f"pretrained_cpu.prompts.generator: {generator!r} is not one of {list(GENERATORS)}")
    if split not in STREAMS:
        raise ConfigError(f"split {split!r} is not one of {list(STREAMS)}")
    rng = np.random.default_rng([int(seed), STREAMS[split]])
    kinds = list(KINDS)
    out = []
    for i in range(int(rows)):
        kind = kinds[i % len(kinds)]
        out.append((kind, KINDS[kind](rng, TOPICS[int(rng.integers(len(TOPICS)))])))
    return pd.DataFrame(out, columns=["kind", "prompt"])


def write(cfg: Mapping[str, Any], out_train: str, out_test: str) -> dict[str, int]:
    """The training prompts (the `download_dataset` table, dataset `offline`) and the test questions (the
    `download_benchmark` table, task = the prompt's kind) of `pretrained_cpu.prompts`."""
    from paperflow.core.io import write_frame

    gen, seed = cfg["generator"], int(cfg["seed"])
    train = prompts(gen, int(cfg["n_train"]), seed, "train")
    test = prompts(gen, int(cfg["n_test"]), seed, "test")
    train = pd.DataFrame({"dataset": "offline", "id": [f"train{i}" for i in range(len(train))], "prompt": train.prompt})
    test = pd.DataFrame(
        {
            "question_id": np.arange(len(test), dtype=np.int64),
            "category": test.kind,
            "task": test.kind,
            "prompt": test.prompt,
        }
    )
    meta = {"generator": gen, "seed": seed}
    write_frame(out_train, train, {"dataset": "offline", **meta})
    write_frame(out_test, test, {"benchmark": "offline", **meta})
    return {"train": len(train), "test": len(test)}
