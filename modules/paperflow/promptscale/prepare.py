"""PromptScale's data stages (download, preprocess): numpy and pandas only, so that they start fast."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame, write_frame
from paperflow.core.lm.tokenizer import vocabulary
from paperflow.promptscale import world as w


def download(source: Mapping[str, Any], cfg: Mapping[str, Any], out: str) -> pd.DataFrame:
    """The smoke "download": seeds (1-2-op plans), held-out items of the same law (no problem shared with the
    seeds) and the harder test set (2-3 ops), from the fixed world seed. Paper scale is refused."""
    if source["kind"] != "designer_world":
        raise ConfigError(
            f"promptscale source.kind {source['kind']!r}: the paper-scale seed corpora (AoPS, Codeforces) and "
            "benchmarks (AIME, HMMT, LiveCodeBench) are not pinned yet (issue 18), so this version refuses them; "
            "use source.kind: designer_world"
        )
    rng = np.random.default_rng(int(cfg["seed"]))
    seeds = w.draw_items(rng, int(cfg["n_seeds"]), 1, 2)
    heldout = w.draw_items(rng, int(cfg["n_heldout"]), 1, 2, exclude={it.problem for it in seeds})
    test = w.draw_items(rng, int(cfg["n_test"]), 2, 3, exclude={it.problem for it in seeds + heldout})
    frame = pd.DataFrame(
        [
            {
                "split": split,
                "concepts": " ".join(it.concepts),
                "plan": " ".join(it.plan),
                "problem": " ".join(it.problem),
                "answer": it.answer,
            }
            for split, items in (("seed", seeds), ("heldout", heldout), ("test", test))
            for it in items
        ]
    )
    write_frame(out, frame, {"world_seed": int(cfg["seed"])})
    return frame


def read_items(path: str, split: str) -> list[w.Item]:
    frame, _ = read_frame(path)
    f = frame[frame["split"] == split]
    if f.empty:
        raise ValueError(f"{path}: no {split} items; rerun download")
    return [
        w.Item(tuple(c.split()), tuple(z.split()), tuple(x.split()))
        for c, z, x in zip(f["concepts"], f["plan"], f["problem"])
    ]


def preprocess(items: str, annotator: Mapping[str, Any], out_triples: str, out_vocab: str) -> pd.DataFrame:
    """The cold-start triples (c, z~, x) of every seed: the annotator's corrupted plan (spec section 4: 35% of the
    plan tokens substituted or permuted; concepts exact), with its alignment accuracy against the true plan."""
    seeds = read_items(items, "seed")
    rng = np.random.default_rng(int(annotator["seed"]))
    noisy = [w.corrupt_plan(it.plan, rng, float(annotator["corruption"])) for it in seeds]
    frame = pd.DataFrame(
        {
            "concepts": [" ".join(it.concepts) for it in seeds],
            "annotated_plan": [" ".join(z) for z in noisy],
            "problem": [" ".join(it.problem) for it in seeds],
            "accuracy": [w.alignment_accuracy(z, it.plan) for z, it in zip(noisy, seeds)],
        }
    )
    write_frame(out_triples, frame, dict(annotator))
    Path(out_vocab).write_text(json.dumps(vocabulary(w.WORDS)))
    return frame


def read_triples(path: str) -> list[tuple]:
    frame, _ = read_frame(path)
    return [
        (tuple(c.split()), tuple(z.split()), tuple(x.split()))
        for c, z, x in zip(frame["concepts"], frame["annotated_plan"], frame["problem"])
    ]
