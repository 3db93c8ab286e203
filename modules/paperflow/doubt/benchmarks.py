"""Paper-scale data (spec section 4, as the official code reads it): the four benchmarks from their Hub parquet
files, each row rendered into the question the MLLM is asked, and the answer-side rules of the code: multiple-choice
answers mapped to "The answer of this question is <choice text>." before embedding (the first digit of the answer
is the choice index; an unparsable answer is kept as it is), and the labels of ans0 (official: the gt index string
occurs in ans0 / the judge's reply holds a 'C' or 'c'; strict: the first digit equals the gt index / the reply
starts with "Correct"). numpy, pandas and PIL only.

Readers (`READERS`), one per benchmark of the code:
- ScienceQA (`derek-thomas/ScienceQA`, test split): rows without an image are skipped (the code's invalid samples);
  choices rendered "(i): text", then "This is a single choice question, answer only with choice number in 0, 1.".
- MMMU (`MMMU/MMMU`, validation split of each subject): the first `per_subject` rows of every subject; rows whose
  question holds "<image 2>" or of question_type "open" are skipped; options (a Python list literal) rendered as
  ScienceQA's; the gt letter becomes its index.
- LLaVABench (`lmms-lab/llava-bench-in-the-wild`): free-form; the reference is `gpt_answer`.
- MMVet (`whyu/mm-vet`): free-form; the code appends "NOTE: Provide only the final answer. Do not provide unrelated
  details." to the question.
"""

from __future__ import annotations

import ast
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.config import ConfigError

MULTI_CHOICE, FREE_FORM = "multi_choice", "free_form"
KINDS = (MULTI_CHOICE, FREE_FORM)
# step 1 and step 2 of object-first (OUB) prompting, as the official code words them (doubt.py)
LIST_PROMPT = (
    "Identify up to 3 main objects in the image. Note: do not use abbreviations for object names, please provide "
    "the full name. Format your output exactly as follows: {Object 1, Object 2, Object 3}."
)
BRIDGE = (
    "At first, use the image description to ensure you understand the image correctly. Then only output your answer "
    "of the question.\nImage Description:"
)
ANSWER_SENTENCE = "The answer of this question is {}."
JUDGE_PROMPT = (
    "Ground truth: {gt}. Model answer: {ans}. Please verify if the model ans matches the ground truth. Respond with "
    "either 'Correct' or 'Wrong' only."
)
JUDGE_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
MMVET_NOTE = "\nNOTE: Provide only the final answer. Do not provide unrelated details."
_CHOICE_LINE = re.compile(r"\(\d+\):\s(.*)")
_DIGIT = re.compile(r"\d")
MMMU_SUBJECTS = (
    "Accounting Agriculture Architecture_and_Engineering Art Art_Theory Basic_Medical_Science Biology Chemistry "
    "Clinical_Medicine Computer_Science Design Diagnostics_and_Laboratory_Medicine Economics Electronics "
    "Energy_and_Power Finance Geography History Literature Manage Marketing Materials Math Mechanical_Engineering "
    "Music Pharmacy Physics Psychology Public_Health Sociology"
).split()


def oub_prompt(question: str, objects: str) -> str:
    """Step 2 of OUB: the question, the bridging instruction and the model's own object list."""
    return question + BRIDGE + objects


def render_choices(question: str, choices: Sequence[str]) -> str:
    """A multiple-choice question as the code renders it: the options "(i): text" on their own lines."""
    lines = "".join(f"({i}): {c}\n" for i, c in enumerate(choices))
    numbers = ", ".join(str(i) for i in range(len(choices)))
    return f"{question}\n{lines}\nThis is a single choice question, answer only with choice number in {numbers}."


def first_digit(answer: str) -> int | None:
    m = _DIGIT.search(answer)
    return int(m.group(0)) if m else None


def map_answers(answers: Sequence[str], question: str) -> list[str]:
    """Multiple-choice answers as the code embeds them: the choice of the answer's first digit (choices read back
    from the rendered question) as "The answer of this question is <text>.", else the answer unchanged."""
    choices = _CHOICE_LINE.findall(question)
    out = []
    for a in answers:
        d = first_digit(a)
        out.append(ANSWER_SENTENCE.format(choices[d]) if d is not None and d < len(choices) else a)
    return out


def label_multi_choice(ans0: str, gt: int) -> tuple[bool, bool]:
    """(official, strict) correctness of a multiple-choice ans0: the gt index string occurs anywhere in it (so "1"
    matches "10"), and its first digit is the gt index."""
    return str(gt) in ans0, first_digit(ans0) == int(gt)


def label_judge(reply: str) -> tuple[bool, bool]:
    """(official, strict) correctness from the judge's reply: the code counts any reply holding 'C' or 'c' as
    correct ("Incorrect" too); strict: the reply starts with "correct" (case-insensitive)."""
    return ("C" in reply or "c" in reply), reply.strip().lower().startswith("correct")


def image_bytes(cell: Any) -> bytes | None:
    """The encoded image of a parquet image cell ({"bytes", "path"} as `datasets` writes it), None when absent."""
    if cell is None or (isinstance(cell, float) and pd.isna(cell)):
        return None
    if isinstance(cell, Mapping):
        return cell.get("bytes")
    if isinstance(cell, bytes):
        return cell
    raise TypeError(f"image cell of type {type(cell).__name__}: expected {{'bytes', 'path'}} or bytes")


def load_image(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def read_parquets(folder: str | Path, pattern: str) -> pd.DataFrame:
    """The files matching `pattern` under a snapshot folder, in name order, as one frame; none is an error."""
    files = sorted(Path(folder).glob(pattern))
    if not files:
        raise FileNotFoundError(f"{folder}: no file matches {pattern!r}")
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def _need(frame: pd.DataFrame, columns: Sequence[str], name: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"benchmark {name!r}: columns {missing} missing (have {list(frame.columns)})")


def _items(rows: list[dict], kind: str) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["idx", "question", "image", "gt", "group"])
    return frame.assign(kind=kind, gt=frame["gt"].astype(str))


def read_scienceqa(folder, bench: Mapping[str, Any]) -> pd.DataFrame:
    frame = pd.concat([read_parquets(folder, p) for p in bench["files"]], ignore_index=True)
    _need(frame, ("image", "question", "choices", "answer"), "ScienceQA")
    rows = []
    for idx, r in enumerate(frame.to_dict("records")):
        img = image_bytes(r["image"])
        if img is None:
            continue
        rows.append([idx, render_choices(r["question"], list(r["choices"])), img, int(r["answer"]), "test"])
    return _items(rows, MULTI_CHOICE)


def read_mmmu(folder, bench: Mapping[str, Any]) -> pd.DataFrame:
    per = int(bench["per_subject"])
    rows = []
    for s, subject in enumerate(bench.get("subjects") or MMMU_SUBJECTS):
        frame = read_parquets(folder, f"{subject}/validation-*.parquet").head(per)
        _need(frame, ("question", "options", "answer", "question_type", "image_1"), f"MMMU/{subject}")
        for k, r in enumerate(frame.to_dict("records")):
            if "<image 2>" in r["question"] or r["question_type"] == "open":
                continue
            options = ast.literal_eval(r["options"])
            gt = "ABCDEFGHIJKLMNOPQRSTUVWXYZ".index(r["answer"])
            rows.append([s * per + k, render_choices(r["question"], options), image_bytes(r["image_1"]), gt, subject])
    return _items(rows, MULTI_CHOICE)


def _free_form(folder, bench, name, answer_col, suffix="") -> pd.DataFrame:
    frame = pd.concat([read_parquets(folder, p) for p in bench["files"]], ignore_index=True)
    _need(frame, ("image", "question", answer_col), name)
    rows = [
        [idx, r["question"] + suffix, image_bytes(r["image"]), r[answer_col], name]
        for idx, r in enumerate(frame.to_dict("records"))
        if image_bytes(r["image"]) is not None and r[answer_col] is not None
    ]
    return _items(rows, FREE_FORM)


def read_llavabench(folder, bench) -> pd.DataFrame:
    return _free_form(folder, bench, "LLaVABench", "gpt_answer")


def read_mmvet(folder, bench) -> pd.DataFrame:
    return _free_form(folder, bench, "MMVet", "answer", MMVET_NOTE)


READERS = {"ScienceQA": read_scienceqa, "MMMU": read_mmmu, "LLaVABench": read_llavabench, "MMVet": read_mmvet}
KIND_OF = {"ScienceQA": MULTI_CHOICE, "MMMU": MULTI_CHOICE, "LLaVABench": FREE_FORM, "MMVet": FREE_FORM}


def hub_patterns(name: str, bench: Mapping[str, Any]) -> list[str]:
    """The Hub files a benchmark's download fetches (only those): its `files`, or MMMU's subjects' validation
    shards."""
    if name == "MMMU":
        return [f"{s}/validation-*.parquet" for s in (bench.get("subjects") or MMMU_SUBJECTS)]
    return list(bench["files"])


def check_benchmarks(benchmarks: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(benchmarks) - set(READERS))
    if unknown:
        raise ConfigError(f"{source}: benchmarks {unknown} have no reader; allowed: {sorted(READERS)}")
    for name, b in benchmarks.items():
        if name == "MMMU" and "per_subject" not in b:
            raise ConfigError(f"{source}: benchmarks.MMMU.per_subject is missing (the code takes 30)")
        if name != "MMMU" and not b.get("files"):
            raise ConfigError(f"{source}: benchmarks.{name}.files is missing (the Hub parquet patterns)")
