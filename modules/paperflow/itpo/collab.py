"""CollabLLM multi-turn data for the recipe (paper scale): the Hub parquet rows made into verl's RL rows, as
`recipe/itpo/process_data/process_dataset.py --dataset_type rl` does (re-implemented, not copied), and the
evaluation's dumped generations read back into one row per conversation, each keyed by its row's `index`.

RL rows (process_dataset.collapse_example): the prompt is the recipe's system prompt (read from the pinned recipe
tree, not retyped here) followed by the first user message; `extra_info` keeps every other field of the row with
the simulator's `interaction_kwargs` (name collabllm, the hidden `single_turn_prompt`, the task description);
rows are deduplicated by prompt and split with `datasets`' train_test_split (validation fraction, seed 42). The
one difference: the row `index` is a uuid5 of the prompt instead of a random uuid4, so that a rerun writes the
same files (verl uses it only as an identifier).
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

REQUIRED_COLUMNS = ("prompt", "single_turn_prompt")
SYSTEM_PROMPT_FILE = Path("recipe") / "itpo" / "process_data" / "process_dataset.py"


def system_prompt(tree: str | Path) -> str:
    """The SYSTEM_PROMPT string constant of the recipe's process_dataset.py (read, not executed)."""
    path = Path(tree) / SYSTEM_PROMPT_FILE
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SYSTEM_PROMPT" for t in node.targets):
            value = ast.literal_eval(node.value)
            if isinstance(value, str) and value:
                return value
    raise ValueError(f"{path}: no SYSTEM_PROMPT string constant")


def collapse(example: Mapping[str, Any], system: str, task_desc: str) -> dict[str, Any]:
    """One Hub row as a verl RL row (process_dataset.collapse_example with the `task_desc` column it adds first)."""
    if "prompt" not in example:
        raise ValueError("a CollabLLM row without 'prompt'")
    ground_truth = (
        example.get("ground_truth") or example.get("single_turn_completion") or example.get("completion") or ""
    )
    extra = {k: v for k, v in example.items() if k not in ("prompt", "ground_truth", "extra_info")}
    extra["task_desc"] = task_desc  # process_dataset maps the column onto every row first
    if "single_turn_prompt" not in extra:
        raise ValueError("a CollabLLM row without 'single_turn_prompt' (the simulator's hidden task)")
    prompt = [{"role": "system", "content": system}, *list(example["prompt"])[:1]]
    extra.setdefault("prompt", prompt)
    extra.setdefault(
        "interaction_kwargs",
        {
            "name": "collabllm",
            "single_turn_prompt": extra.pop("single_turn_prompt"),
            "task_desc": extra.pop("task_desc", "general ask-for-assistance task"),
        },
    )
    key = json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return {
        "prompt": prompt,
        "ground_truth": ground_truth,
        "raw_prompt": prompt,
        "extra_info": extra,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "data_source": "collabllm",
        "agent_name": "itpo_collabllm_agent",
        "index": str(uuid.uuid5(uuid.NAMESPACE_URL, key)),
    }


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from a parquet read as plain lists and numbers (json-able, as `datasets` gives)."""
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def hub_rows(folder: str | Path) -> list[dict[str, Any]]:
    """Every row of the snapshot's parquet files (all splits concatenated, as process_dataset does)."""
    files = sorted(Path(folder).rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"{folder}: no parquet files (is `files` in the task's config the repo's layout?)")
    frame = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"{folder}: the rows lack {missing} (columns: {list(frame.columns)})")
    return [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]


def rl_splits(
    rows: list[Mapping[str, Any]], system: str, task_desc: str, validation_size: float, seed: int
) -> dict[str, Any]:
    """{'train', 'validation'}: `datasets.Dataset`s of the collapsed, deduplicated rows, split as the recipe."""
    from datasets import Dataset

    seen, unique = set(), []
    for row in rows:
        out = collapse(row, system, task_desc)
        key = json.dumps(out["prompt"], sort_keys=True, ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            unique.append(out)
    split = Dataset.from_list(unique).train_test_split(test_size=validation_size, seed=seed, shuffle=True)
    return {"train": split["train"], "validation": split["test"]}


DUMP_FIELDS = ("input", "output", "score")


def read_dump(folder: str | Path) -> list[dict[str, Any]]:
    """The evaluation's dumped generations (verl's `_dump_generations`: `<step>.jsonl` under recipe/itpo/val_out,
    one object per rollout with input, output, gts, score and the per-rollout reward infos) of the latest step, one
    dict per rollout in the dump's order. The dump names no row of the data: `input` is the decoded prompt."""
    files = sorted(
        Path(folder).glob("*.jsonl"),
        key=lambda p: (not p.stem.isdigit(), int(p.stem) if p.stem.isdigit() else 0, p.name),
    )
    if not files:
        raise FileNotFoundError(f"{folder}: the evaluation dumped no generations (<step>.jsonl)")
    rows = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        missing = [c for c in DUMP_FIELDS if c not in row]
        if missing:
            raise ValueError(f"{files[-1]}: rollout {i} has no {missing} field (fields: {sorted(row)})")
    return rows


def request(prompt: Any) -> str:
    """The text that tells a row's prompt from the others': its last message (the user's first request, after the
    system prompt every row shares)."""
    messages = list(prompt)
    if not messages or not isinstance(messages[-1].get("content"), str) or not messages[-1]["content"]:
        raise ValueError(f"a prompt whose last message has no text: {messages[-1:]!r}")
    return messages[-1]["content"]


def key_rollouts(
    rollouts: list[Mapping[str, Any]], rows: list[tuple[str, Any]], n: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """The dumped `rollouts` of one evaluator run over `rows` ((the row's `index`, its prompt) in the data's order),
    each given its row (`prompt_index`) and its rank among that row's rollouts in the dump (`rollout`), ordered by
    row, then rank: the order does not depend on how verl ordered the rows (the evaluator's val DataLoader
    shuffles). A rollout's `input` is verl's decoded prompt, which holds the row's messages verbatim; it belongs to
    the row whose `request` is the longest found in it (a shorter request may be part of a longer one). Refused: a
    rollout that matches no row or two rows alike, a row with a number of rollouts other than 0 or `n`. Returns
    (the keyed rollouts, the indexes of the rows without any: verl's data.filter_overlong_prompts drops them)."""
    requests = [(row_id, request(prompt)) for row_id, prompt in rows]
    owner: dict[str, str] = {}
    by_row: dict[str, list[dict[str, Any]]] = {row_id: [] for row_id, _ in requests}
    for i, rollout in enumerate(rollouts):
        text = str(rollout["input"])
        if text not in owner:
            found = sorted(((len(r), row_id) for row_id, r in requests if r in text), reverse=True)
            if not found:
                raise ValueError(f"rollout {i}: its input matches no prompt of the evaluated rows: {text[:300]!r}")
            if len(found) > 1 and found[0][0] == found[1][0]:
                raise ValueError(f"rollout {i}: its input matches rows {found[0][1]} and {found[1][1]} alike")
            owner[text] = found[0][1]
        by_row[owner[text]].append(dict(rollout))
    keyed, unscored = [], []
    for row_id, _ in requests:
        got = by_row[row_id]
        if not got:
            unscored.append(row_id)
        elif len(got) != n:
            raise ValueError(f"prompt {row_id}: {len(got)} rollouts in the dump, not the {n} asked (eval.n)")
        keyed += [{**r, "prompt_index": row_id, "rollout": k} for k, r in enumerate(got)]
    return keyed, unscored


def generations_frame(rollouts: list[Mapping[str, Any]]) -> pd.DataFrame:
    """Dumped rollouts as one frame, the whitespace words of each decoded response added (`output_words`). The
    columns in one order whatever the rows' key order (a journal reread gives its keys sorted): verl's dump fields
    first, then the row's key and rank, then the reward infos by name."""
    frame = pd.DataFrame(list(rollouts))
    missing = [c for c in DUMP_FIELDS if c not in frame.columns]
    if missing:
        raise ValueError(f"the rollouts have no {missing} column (columns: {list(frame.columns)})")
    first = [c for c in (*DUMP_FIELDS, "gts", "step", "prompt_index", "rollout") if c in frame.columns]
    frame = frame[first + sorted(c for c in frame.columns if c not in first)]
    return frame.assign(output_words=frame["output"].astype(str).str.split().str.len())


def summarise(frame: pd.DataFrame, metric: str) -> dict[str, Any]:
    """The means over rollouts: the recipe's conversation reward (`score`: the weighted task metric plus the
    length cost), the task metric where the dump carries it per rollout (else None), the response words."""
    return {
        "rollouts": len(frame),
        "prompts": int(frame["input"].nunique()),
        "reward": float(frame["score"].mean()),
        "metric": metric,
        "metric_mean": float(frame[metric].mean()) if metric in frame.columns else None,
        "output_words": float(frame["output_words"].mean()),
    }
