"""The paper scale's math data (spec section 4): a Hub dataset's files read as its publisher lays them out, its
problem and answer columns named in the config (a dotted path reaches into nested columns, e.g. DAPO-Math-17k's
`prompt.0.content` and `reward_model.ground_truth`), and the prompt every model sees."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.config import ConfigError

READERS = {
    ".parquet": pd.read_parquet,
    ".jsonl": lambda p: pd.read_json(p, lines=True, dtype=False),
    ".json": lambda p: pd.read_json(p, dtype=False),
}


def snapshot_files(folder: str | Path, patterns: Sequence[str]) -> list[Path]:
    """The data files under `folder` (a snapshot_download folder) whose repo path matches one of `patterns`."""
    folder = Path(folder)
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and path.suffix in READERS and any(fnmatch.fnmatch(rel, p) for p in patterns):
            found.append(path)
    return found


def read_snapshot(folder: str | Path, patterns: Sequence[str], where: str) -> pd.DataFrame:
    files = snapshot_files(folder, patterns)
    if not files:
        raise FileNotFoundError(f"{where}: no .parquet/.jsonl/.json file under {folder} matches {list(patterns)}")
    return pd.concat([READERS[f.suffix](f) for f in files], ignore_index=True)


def _walk(value: Any, parts: Sequence[str], path: str, key: str) -> Any:
    for part in parts:
        if isinstance(value, Mapping):
            if part not in value:
                raise ConfigError(f"{key} = {path!r}: no field {part!r} (fields: {sorted(value)})")
            value = value[part]
        elif part.isdigit() and hasattr(value, "__getitem__") and not isinstance(value, str):
            value = value[int(part)]
        else:
            raise ConfigError(f"{key} = {path!r}: cannot take {part!r} of a {type(value).__name__}")
    return value


def column(frame: pd.DataFrame, path: str, key: str) -> list[Any]:
    """The values of column path `path` ("col" or "col.field.0.field"); `key` names the config key in errors."""
    head, *rest = path.split(".")
    if head not in frame.columns:
        raise ConfigError(f"{key} = {path!r}: the dataset has no column {head!r} (columns: {list(frame.columns)})")
    return [_walk(v, rest, path, key) for v in frame[head]]


def problems(frame: pd.DataFrame, spec: Mapping[str, Any], key: str) -> pd.DataFrame:
    """(problem, answer) rows of a raw table: the configured columns, the publisher's instruction stripped where
    `strip_prefix` / `strip_suffix` are given (a row without them is refused: the layout is not the expected one),
    duplicates of a problem dropped where `dedupe` (DAPO-Math-17k repeats each problem)."""
    text = [str(v) for v in column(frame, spec["problem"], f"{key}.problem")]
    answer = [str(v) for v in column(frame, spec["answer"], f"{key}.answer")]
    for end, name in ((spec.get("strip_prefix"), "strip_prefix"), (spec.get("strip_suffix"), "strip_suffix")):
        if not end:
            continue
        has = [t.startswith(end) if name == "strip_prefix" else t.endswith(end) for t in text]
        if not all(has):
            raise ValueError(f"{key}.{name}: {has.count(False)} of {len(text)} problems do not carry it")
        text = [t[len(end) :] if name == "strip_prefix" else t[: len(t) - len(end)] for t in text]
    out = pd.DataFrame({"problem": [t.strip() for t in text], "answer": [a.strip() for a in answer]})
    if spec.get("dedupe"):
        out = out.drop_duplicates("problem", ignore_index=True)
    return out


def prompt(template: str, problem: str) -> str:
    """The text the model continues: `template` with `{problem}` replaced (no other brace is interpreted)."""
    return template.replace("{problem}", problem)


def check_template(template: str, key: str) -> None:
    if template.count("{problem}") != 1:
        raise ConfigError(f"{key} must contain '{{problem}}' exactly once, got {template!r}")


def stop_ids(tokenizer, stop_tokens: Sequence[str]) -> list[int]:
    """The ids a completion ends at: the tokenizer's EOS and `stop_tokens` (e.g. the chat format's end of turn); a
    stop token the tokenizer does not have is refused (it would silently be the unknown token)."""
    stops = [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(stop_tokens))]
    if None in stops or (tokenizer.unk_token_id is not None and tokenizer.unk_token_id in stops[1:]):
        raise ConfigError(f"math.rollout.stop_tokens {list(stop_tokens)} are not all tokens of the tokenizer")
    return sorted(set(stops))
