"""The digit-world problems of the smoke and tiny scales (spec section 4's task S and task P): light, no torch, so
that the download and preprocess stages start fast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.lm.digitworld import DigitWorld, Example


def world_of(data: Mapping[str, Any]) -> DigitWorld:
    return DigitWorld.from_config(data["tasks"])


def make_problems(data: Mapping[str, Any]) -> pd.DataFrame:
    """Per task: `n_test` held-out prompts (their own generator) and `n_train` training prompts drawn apart from
    them (spec section 6, make_task)."""
    world = world_of(data)
    rows = []
    for k, name in enumerate(data["tasks"]):
        test = world.held_out(name, int(data["n_test"]), seed=int(data["seed"]) * 1000 + 2 * k + 1)
        train = world.sample(name, int(data["n_train"]), np.random.default_rng(int(data["seed"]) * 1000 + 2 * k), test)
        for split, exs in (("test", test), ("train", train)):
            rows += [
                {"task": name, "split": split, "prompt": " ".join(e.prompt), "answer": " ".join(e.answer)} for e in exs
            ]
    return pd.DataFrame(rows)


def examples(frame: pd.DataFrame) -> list[Example]:
    return [Example(t, tuple(p.split()), tuple(a.split())) for t, p, a in zip(frame.task, frame.prompt, frame.answer)]
