"""eapo's download stage at smoke and tiny scale: the task is generated, so "download" writes the fixed test
problems. Paper scale (the math training set and benchmarks) has its own download rules (paper.smk, `paper`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.io import write_frame
from paperflow.core.lm.digitworld import DigitWorld

TASK = "addition"


def download(source: Mapping[str, Any], task: Mapping[str, Any], out: str):
    if source["kind"] != "synthetic":
        raise ConfigError(
            f"eapo source.kind {source['kind']!r}: this stage writes the synthetic task only; the math data (spec "
            "section 4) are fetched by the paper-scale rules (workflows/eapo/paper.smk, paperflow.eapo.paper)"
        )
    return write_problems(task, out)


def write_problems(task_cfg: Mapping[str, Any], out: str) -> pd.DataFrame:
    """The fixed test problems (spec section 4: 500 pairs, seed 12345), kept out of every training stream."""
    world = DigitWorld.from_config({TASK: {"n_digits": task_cfg["n_digits"]}})
    test = world.held_out(TASK, int(task_cfg["test_size"]), seed=int(task_cfg["test_seed"]))
    frame = pd.DataFrame({"prompt": [" ".join(e.prompt) for e in test], "answer": [" ".join(e.answer) for e in test]})
    write_frame(out, frame, {"task": TASK, **dict(task_cfg)})
    return frame


def write_vocabulary(task_cfg: Mapping[str, Any], problems: str, out: str) -> list[str]:
    """The task's token list (ids in order: specials, then the task's words) as JSON, after checking that every
    word of the test problems is in it; the training stages refuse a tokenizer that differs from this file."""
    import json

    from paperflow.core.io import read_frame
    from paperflow.core.lm.tokenizer import vocabulary

    world = DigitWorld.from_config({TASK: {"n_digits": task_cfg["n_digits"]}})
    words = vocabulary(world.words, world.specials)
    frame, _ = read_frame(problems)
    missing = {w for text in (*frame["prompt"], *frame["answer"]) for w in text.split()} - set(words)
    if missing:
        raise ValueError(f"{problems}: words outside the task's vocabulary: {sorted(missing)}")
    with open(out, "w") as fh:
        json.dump(words, fh)
    return words
