"""Paper-scale data (spec section 4, MeZO's protocol): the SuperGLUE / GLUE classification tasks read from the Hub's
parquet files, sampled as MeZO samples them, rendered with MeZO's prompt templates and tokenized for a causal LM.

Sampling (MeZO `large_models`: tasks.py and run.py): one permutation of the HF train split, seeded with the data
seed through numpy's legacy generator (MeZO calls np.random.seed then np.random.permutation), gives train + dev
rows, dev being the last `dev` of them (500; 100 for CB); the test rows are the first `test` (1000) of a permutation
of the HF validation split with the same seed (the SuperGLUE test labels are hidden). A split smaller than asked
gives all its rows, so CB trains on 150 rows and WSC on 54, as MeZO's rule gives.

Templates (MeZO `templates.py`, from PromptSource): the prompt ends where the answer starts; each class has a label
word. Classification is trained "as classification": the loss is the cross-entropy over the label words' logits
at the prompt's last position (`pretrained.LabelWordScorer`), so only each label word's first token matters, and it
must differ between the classes. numpy and pandas only; the tokenizer is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError


@dataclass(frozen=True)
class Template:
    """A task's prompt (`render(row)`), its label words by class index, and the text between prompt and word."""

    columns: tuple[str, ...]
    render: Callable[[Mapping[str, Any]], str]
    words: tuple[str, ...]
    joiner: str = ""


def _question(q: str) -> str:
    q = q if q.endswith("?") else q + "?"
    return q[0].upper() + q[1:]


TEMPLATES = {
    # glue sst2: label 0 negative, 1 positive
    "sst2": Template(("sentence",), lambda r: f"{r['sentence'].strip()} It was", ("terrible", "great"), " "),
    # super_glue rte: 0 entailment, 1 not_entailment
    "rte": Template(
        ("premise", "hypothesis"),
        lambda r: f'{r["premise"]}\nDoes this mean that "{r["hypothesis"]}" is true? Yes or No?\n',
        ("Yes", "No"),
    ),
    # super_glue cb: 0 entailment, 1 contradiction, 2 neutral
    "cb": Template(
        ("premise", "hypothesis"),
        lambda r: f'Suppose {r["premise"]} Can we infer that "{r["hypothesis"]}"? Yes, No, or Maybe?\n',
        ("Yes", "No", "Maybe"),
    ),
    # super_glue boolq: 0 False, 1 True (MeZO's default BoolQ template, its third version)
    "boolq": Template(("passage", "question"), lambda r: f"{r['passage']} {_question(r['question'])}\n", ("No", "Yes")),
    # super_glue wsc.fixed: 0 False, 1 True
    "wsc": Template(
        ("text", "span1_text", "span2_text"),
        lambda r: (
            f'{r["text"]}\nIn the previous sentence, does the pronoun "{r["span2_text"].lower()}" refer to '
            f"{r['span1_text']}? Yes or No?\n"
        ),
        ("No", "Yes"),
    ),
    # super_glue wic: 0 False, 1 True
    "wic": Template(
        ("word", "sentence1", "sentence2"),
        lambda r: (
            f'Does the word "{r["word"]}" have the same meaning in these two sentences? Yes, No?\n'
            f"{r['sentence1']}\n{r['sentence2']}\n"
        ),
        ("No", "Yes"),
    ),
    # super_glue multirc: 0 False, 1 True (one row per candidate answer)
    "multirc": Template(
        ("paragraph", "question", "answer"),
        lambda r: (
            f'{r["paragraph"]}\nQuestion: {r["question"]}\nI found this answer "{r["answer"]}". Is that correct? '
            "Yes or No?\n"
        ),
        ("No", "Yes"),
    ),
}
HF_SPLITS = ("train", "validation")


def split_files(subset: str, split: str) -> str:
    """The Hub path pattern of one split's parquet shards in a GLUE / SuperGLUE repo (`rte/train-00000-of-00001.parquet`)."""
    return f"{subset}/{split}-*.parquet"


def read_hub_split(folder: str | Path, subset: str, split: str) -> pd.DataFrame:
    """A split's shards under a snapshot folder, in name order, as one frame; none found is an error naming them."""
    files = sorted(Path(folder).glob(split_files(subset, split)))
    if not files:
        raise FileNotFoundError(f"{folder}: no file matches {split_files(subset, split)!r}")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def mezo_sample(n_train: int, n_valid: int, sizes: Mapping[str, int], seed: int) -> dict[str, np.ndarray]:
    """Row indices of train / dev (into the HF train split) and test (into the HF validation split), MeZO's way."""
    picked = np.random.RandomState(seed).permutation(n_train)[: int(sizes["train"]) + int(sizes["dev"])]
    if len(picked) <= int(sizes["dev"]):
        raise ValueError(f"the train split has {n_train} rows: none left for training after {sizes['dev']} dev rows")
    test = np.random.RandomState(seed).permutation(n_valid)[: int(sizes["test"])]
    return {"train": picked[: -int(sizes["dev"])], "dev": picked[-int(sizes["dev"]) :], "test": test}


def prompts(task: str, frame: pd.DataFrame) -> list[str]:
    """The rendered prompts of a task's rows; a frame without the template's columns is refused by name."""
    template = TEMPLATES[task]
    missing = [c for c in (*template.columns, "label") if c not in frame.columns]
    if missing:
        raise ValueError(f"task {task!r}: columns {missing} missing (have {list(frame.columns)})")
    return [template.render(row) for row in frame.to_dict("records")]


def label_tokens(tokenizer, task: str, prompt: str) -> tuple[int, ...]:
    """The first token of each class's label word after `prompt` (tokenized in context, so a BPE tokenizer gives
    the word with its leading space or newline as the model would read it)."""
    template = TEMPLATES[task]
    base = tokenizer(prompt)["input_ids"]
    out = []
    for word in template.words:
        full = tokenizer(prompt + template.joiner + word)["input_ids"]
        if full[: len(base)] != base or len(full) == len(base):
            raise ValueError(f"task {task!r}: the prompt's tokens are not a prefix of prompt + {word!r}")
        out.append(int(full[len(base)]))
    if len(set(out)) != len(out):
        raise ValueError(f"task {task!r}: label words {template.words} share a first token {out}")
    return tuple(out)


def encode(tokenizer, task: str, texts: Sequence[str], max_length: int) -> tuple[list[list[int]], tuple[int, ...], int]:
    """(ids per prompt, the label tokens, how many prompts were cut): prompts longer than `max_length` keep their
    last tokens (the question and the answer position). The label tokens must be the same for every prompt."""
    ids, words, cut = [], None, 0
    for text in texts:
        row = list(tokenizer(text)["input_ids"])
        tokens = label_tokens(tokenizer, task, text)
        if words is not None and tokens != words:
            raise ValueError(f"task {task!r}: the label words tokenize differently after different prompts")
        words = tokens
        cut += len(row) > max_length
        ids.append(row[-max_length:])
    return ids, words, cut


def check_tasks(tasks: Mapping[str, Any], source: str) -> None:
    from paperflow.lozo_plus.lmtask_formats import LM_TASKS

    known = set(TEMPLATES) | set(LM_TASKS)
    unknown = sorted(set(tasks) - known)
    if unknown:
        raise ConfigError(f"{source}: tasks {unknown} have no template; allowed: {sorted(known)}")
    extra = sorted(t for t, d in tasks.items() if "max_new_tokens" in d and LM_TASKS.get(t, None) is None)
    extra += sorted(
        t for t, d in tasks.items() if t in LM_TASKS and "max_new_tokens" in d and LM_TASKS[t].kind != "generate"
    )
    if extra:
        raise ConfigError(f"{source}: tasks {extra} set max_new_tokens, which only the generative tasks read")
