"""The texts of PromptScale at paper scale (standard library only: the vLLM jobs run in envs/lm-serve.yaml, which has
no pandas or numpy): the PromptCoT 1.0 triples parsed from its problem-generation set, the benchmark rows
normalised to (id, problem, answer), the prompt templates of q_phi and p_theta, the parsing of what they write, and
the boxed-answer check of the math benchmarks.

PromptCoT 1.0's set holds `prompt` (the foundational concepts, numbered, and a difficulty level) and `completion`
(the rationale and the problem between HTML comment markers); both models here write the markers too, so the
rationale model q and the prompt model p score and generate exactly the spans of spec section 9:

    p_theta:  P_PROMPT(c) | <!-- BEGIN RATIONALE --> z <!-- END RATIONALE --> <!-- BEGIN PROBLEM --> x <!-- END PROBLEM --> <eos>
    q_phi:    Q_PROMPT(c, x) ... <!-- BEGIN RATIONALE -->  | z <!-- END RATIONALE --> <eos>
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

RATIONALE = ("<!-- BEGIN RATIONALE -->", "<!-- END RATIONALE -->")
PROBLEM = ("<!-- BEGIN PROBLEM -->", "<!-- END PROBLEM -->")
CONCEPTS_HEAD = "Foundational Concepts:"
DIFFICULTY_HEAD = "Difficulty Level:"
_NUMBERED = re.compile(r"^\s*\d+\s*[.)]\s*(.+?)\s*$")
BENCHMARK_FORMATS = ("problem_answer", "problem_solution_boxed")
CODE_FORMATS = ("livecodebench",)  # paperflow.promptscale.code_eval
SFT_FORMATS = ("prompt_completion",)  # paperflow.promptscale.sft_arm
FORMATS = ("promptcot_triples", *BENCHMARK_FORMATS, *CODE_FORMATS, *SFT_FORMATS)


# --- files --------------------------------------------------------------------------------------------------------


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_snapshot_records(folder: str | Path, patterns: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of the snapshot's files matching `patterns` (parquet, JSON lines, or a .json file holding a list, an
    object or JSON lines), files in path order. No matching file is an error naming the patterns and what the folder holds."""
    import fnmatch

    import pandas as pd

    folder = Path(folder)
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file()
        and ".cache" not in p.parts
        and any(fnmatch.fnmatch(p.relative_to(folder).as_posix(), pat) for pat in patterns)
        and p.suffix in (".parquet", ".jsonl", ".json")
    )
    if not files:
        held = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())[:20]
        raise FileNotFoundError(f"{folder}: no parquet/jsonl/json file matches {list(patterns)}; it holds {held}")
    records: list[dict[str, Any]] = []
    for path in files:
        if path.suffix == ".parquet":
            records += pd.read_parquet(path).to_dict("records")
        elif path.suffix == ".jsonl":
            records += read_jsonl(path)
        else:
            text = path.read_text(encoding="utf-8")
            try:
                doc = json.loads(text)
            except json.JSONDecodeError:  # JSON lines under a .json name
                records += [json.loads(line) for line in text.splitlines() if line.strip()]
                continue
            records += doc if isinstance(doc, list) else [doc]
    return records


def model_folder(info_json: str | Path) -> str:
    """The folder of a model named by a download or train rule's JSON output ({"folder": ...})."""
    return json.loads(Path(info_json).read_text())["folder"]


def write_model_json(out_json: str | Path, model: str, folder: str | Path) -> dict[str, Any]:
    """A train rule's JSON output: {"model", "folder", "files": {name: bytes}} for the model saved in `folder`
    (what `model_folder` reads back)."""
    folder = Path(folder)
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    doc = {"model": model, "folder": str(folder), "files": files}
    Path(out_json).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def loss_summary(model: str, logged: list[dict[str, Any]]) -> dict[str, Any]:
    """{"model", "steps", "final_loss"} of a TRL run's logged rows (steps: the rows that carry a loss)."""
    losses = [r["loss"] for r in logged if "loss" in r]
    return {"model": model, "steps": len(losses), "final_loss": losses[-1] if losses else None}


# --- PromptCoT 1.0 triples ----------------------------------------------------------------------------------------


def _between(text: str, markers: tuple[str, str]) -> str | None:
    start, end = text.find(markers[0]), text.find(markers[1])
    if start < 0 or end < start:
        return None
    return text[start + len(markers[0]) : end].strip()


def parse_concepts(prompt: str) -> tuple[list[str], str] | None:
    """(concepts, difficulty) from a PromptCoT 1.0 prompt: the numbered lines after "Foundational Concepts:" up to
    "Difficulty Level:", and that level's line. None when either head is missing or no concept is listed."""
    start, end = prompt.find(CONCEPTS_HEAD), prompt.find(DIFFICULTY_HEAD)
    if start < 0 or end < start:
        return None
    concepts = []
    for line in prompt[start + len(CONCEPTS_HEAD) : end].splitlines():
        match = _NUMBERED.match(line)
        if match:
            concepts.append(match.group(1))
    difficulty = prompt[end + len(DIFFICULTY_HEAD) :].strip().splitlines()
    if not concepts or not difficulty or not difficulty[0].strip():
        return None
    return concepts, difficulty[0].strip()


def parse_triple(prompt: str, completion: str) -> dict[str, Any] | None:
    """{"concepts", "difficulty", "rationale", "problem"} of one row of the 1.0 set, None when a part is missing."""
    head = parse_concepts(prompt)
    rationale, problem = _between(completion, RATIONALE), _between(completion, PROBLEM)
    if head is None or not rationale or not problem:
        return None
    return {"concepts": head[0], "difficulty": head[1], "rationale": rationale, "problem": problem}


# --- benchmarks ---------------------------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in `text` (braces balanced), None when there is none."""
    start = text.rfind("\\boxed")
    while start >= 0:
        i = text.find("{", start)
        if i < 0:
            return None
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def normalise_answer(text: str) -> str:
    """An answer as compared: spaces, `$`, a leading "=" and \\text{...}/\\left/\\right dropped; an integer written
    with leading zeros or a trailing ".0" reduced to its digits (AIME answers are 000-999)."""
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", str(text))
    s = s.replace("\\left", "").replace("\\right", "").replace("$", "").replace(" ", "").lstrip("=")
    if re.fullmatch(r"[+-]?\d+(\.0+)?", s):
        return str(int(float(s)))
    return s


def answer_matches(completion: str, reference: str) -> bool:
    """Exact match of the completion's last boxed answer with the reference (spec 8: AIME / HMMT)."""
    got = last_boxed(completion)
    return got is not None and normalise_answer(got) == normalise_answer(reference)


def benchmark_rows(records: Sequence[Mapping[str, Any]], fmt: str, name: str) -> list[dict[str, Any]]:
    """(id, problem, answer) rows of a benchmark file: `problem_answer` reads its columns as they are;
    `problem_solution_boxed` takes the answer from the solution's last \\boxed{}. A row without an answer is
    refused by its position."""
    if fmt not in BENCHMARK_FORMATS:
        raise ValueError(f"benchmark {name}: format {fmt!r} is not one of {BENCHMARK_FORMATS}")
    rows = []
    for i, r in enumerate(records):
        answer = r.get("answer") if fmt == "problem_answer" else last_boxed(str(r.get("solution", "")))
        if answer is None or str(answer).strip() == "" or not str(r.get("problem", "")).strip():
            raise ValueError(f"benchmark {name}: row {i} has no problem or no answer ({fmt}); columns {sorted(r)}")
        ident = r.get("id", r.get("problem_idx", i))
        rows.append({"id": str(ident), "problem": str(r["problem"]), "answer": str(answer).strip()})
    return rows


# --- templates ----------------------------------------------------------------------------------------------------


def _concept_lines(concepts: Sequence[str]) -> str:
    return "\n".join(f"{i + 1}. {c}" for i, c in enumerate(concepts))


def p_prompt(concepts: Sequence[str], difficulty: str) -> str:
    return (
        f"{CONCEPTS_HEAD}\n{_concept_lines(concepts)}\n\n{DIFFICULTY_HEAD} {difficulty}\n\n"
        "Design one problem from these concepts at this difficulty: first the rationale, then the problem.\n"
    )


def p_completion(rationale: str, problem: str) -> str:
    return f"{RATIONALE[0]}\n{rationale}\n{RATIONALE[1]}\n\n{PROBLEM[0]}\n{problem}\n{PROBLEM[1]}"


def q_prompt(concepts: Sequence[str], difficulty: str, problem: str) -> str:
    return (
        f"{CONCEPTS_HEAD}\n{_concept_lines(concepts)}\n\n{DIFFICULTY_HEAD} {difficulty}\n\nProblem:\n{problem}\n\n"
        "Reverse-engineer the rationale by which a teacher designs exactly this problem from these concepts.\n"
        f"{RATIONALE[0]}\n"
    )


def q_completion(rationale: str) -> str:
    return f"{rationale}\n{RATIONALE[1]}"


def rationale_of_sample(text: str) -> str | None:
    """The rationale a sample of q wrote: the text before the end marker (vLLM stops at it, so it may be absent),
    None when empty."""
    end = text.find(RATIONALE[1])
    body = (text if end < 0 else text[:end]).strip()
    return body or None


def parse_synthesis(text: str) -> dict[str, Any]:
    """What a sample of p wrote: {"rationale", "problem", "valid"}; valid when both spans are there and the
    problem is not empty (spec 8's validity, at paper scale the format check only)."""
    rationale, problem = _between(text, RATIONALE), _between(text, PROBLEM)
    return {"rationale": rationale, "problem": problem, "valid": bool(rationale) and bool(problem)}


def pairs_q(triples: Sequence[Mapping[str, Any]], rationale_key: str = "rationale") -> list[dict[str, str]]:
    """q's SFT data: (c, x) -> z."""
    return [
        {
            "prompt": q_prompt(t["concepts"], t["difficulty"], t["problem"]),
            "completion": q_completion(t[rationale_key]),
        }
        for t in triples
    ]


def pairs_p(triples: Sequence[Mapping[str, Any]], rationale_key: str = "rationale") -> list[dict[str, str]]:
    """p's SFT data: c -> (z, x)."""
    return [
        {"prompt": p_prompt(t["concepts"], t["difficulty"]), "completion": p_completion(t[rationale_key], t["problem"])}
        for t in triples
    ]


MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def eval_prompt(problem: str) -> str:
    """The user message of a math benchmark problem (the Qwen3 / DeepSeek-R1 convention)."""
    return f"{problem}\n\n{MATH_INSTRUCTION}"
