"""PromptScale's code-domain seeds at paper scale (spec 2.2, "Cold start"): Codeforces statements annotated by four
instruct models into (concepts, difficulty, rationale, problem) triples, the same row shape as PromptCoT 1.0's math
triples, plus {"domain": "code", "annotator", "id", "rating", "tags"}.

download_statements   open-r1/codeforces at its pinned commit -> one statement per problem (format
                      `codeforces_statements`): title, description, input/output formats, examples and note
                      assembled into one text; rating and tags kept as metadata; interactive problems and ones
                      without a description dropped and counted
assign                which annotator annotates which statement: not published, so ours is a salted SHA-256 of the
                      problem id, split by the annotators' configured shares (independent of file order)
annotate              one annotator's job: two chat requests per statement on that model's vLLM server, (1) the
                      foundational concepts, (2) given concepts, difficulty and problem, the designer's rationale;
                      both answers parsed from marked spans; malformed ones dropped and counted by reason

The prompts are ours (the paper's annotation prompts are not published). This module uses the standard library
only (the annotate jobs run in envs/lm-serve.yaml); the download imports pyarrow and the Hub helpers lazily (envs/lm).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.promptscale import llm_text as lt

SLUG = "promptscale"
STATEMENT_FORMATS = ("codeforces_statements",)
CONCEPTS = ("<!-- BEGIN CONCEPTS -->", "<!-- END CONCEPTS -->")
# the columns of open-r1/codeforces (its dataset card's features) that a statement is assembled from
STATEMENT_COLUMNS = (
    "id",
    "contest_id",
    "index",
    "title",
    "description",
    "input_format",
    "output_format",
    "interaction_format",
    "note",
    "examples",
    "rating",
    "tags",
)
_ITEM = re.compile(r"^\s*(?:\d+\s*[.):]|[-*\u2022])\s*(.+?)\s*$")
DROP_REASONS = (
    "concepts_unmarked",
    "concepts_truncated",
    "too_few_concepts",
    "rationale_unmarked",
    "rationale_truncated",
    "rationale_empty",
)


# --- statements ---------------------------------------------------------------------------------------------------


def _text(value: Any) -> str:
    """A column value as stripped text; None, NaN and missing as ''."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return str(value).strip()


def statement_text(record: Mapping[str, Any]) -> str:
    """One Codeforces statement as the problem text of a seed: the title, the description (legend), the input and
    output formats, the examples (input / output pairs) and the note, each part that is present under its head."""
    parts = [f"{_text(record.get('title'))}".strip(), _text(record.get("description"))]
    for head, key in (("Input", "input_format"), ("Output", "output_format")):
        if _text(record.get(key)):
            parts.append(f"{head}\n{_text(record.get(key))}")
    for i, ex in enumerate(list(record.get("examples") or []), 1):
        parts.append(f"Example {i}\nInput:\n{_text(ex.get('input'))}\nOutput:\n{_text(ex.get('output'))}")
    if _text(record.get("note")):
        parts.append(f"Note\n{_text(record.get('note'))}")
    return "\n\n".join(p for p in parts if p)


def difficulty_of(rating: Any) -> str:
    """The difficulty level of a code seed: "Codeforces <rating>" when the problem has a rating, else "Codeforces"
    (the level PromptCoT 2.0's released concept sets give their code seeds, "codeforces", plus the rating)."""
    text = _text(rating)
    try:
        return f"Codeforces {int(float(text))}" if text else "Codeforces"
    except ValueError:
        return "Codeforces"


def statements(records: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The statement rows {"id", "contest_id", "index", "rating", "tags", "difficulty", "problem"} of open-r1/
    codeforces records, in record order: an interactive problem (an interaction format), one without a description
    and a repeated id are dropped. Returns (rows, counts of records, kept and each drop reason)."""
    rows, seen, counts = [], set(), Counter(records=len(records))
    for r in records:
        ident = _text(r.get("id"))
        if _text(r.get("interaction_format")):
            counts["interactive"] += 1
        elif not _text(r.get("description")):
            counts["no_description"] += 1
        elif not ident or ident in seen:
            counts["duplicate_id"] += 1
        else:
            seen.add(ident)
            rating = _text(r.get("rating"))
            rows.append(
                {
                    "id": ident,
                    "contest_id": _text(r.get("contest_id")),
                    "index": _text(r.get("index")),
                    "rating": int(float(rating)) if rating else None,
                    "tags": [str(t) for t in list(r.get("tags") if r.get("tags") is not None else [])],
                    "difficulty": difficulty_of(rating),
                    "problem": statement_text(r),
                }
            )
    counts["kept"] = len(rows)
    return rows, {k: counts.get(k, 0) for k in ("records", "kept", "interactive", "no_description", "duplicate_id")}


def read_statement_records(folder: str | Path, patterns: Sequence[str]) -> list[dict[str, Any]]:
    """The statement columns of every parquet file of the snapshot matching `patterns`, files in path order (only
    those columns are read: the files also hold the official tests, GBs). Refused naming what is missing."""
    import fnmatch

    import pyarrow.parquet as pq

    folder = Path(folder)
    files = sorted(
        p
        for p in folder.rglob("*.parquet")
        if ".cache" not in p.parts and any(fnmatch.fnmatch(p.relative_to(folder).as_posix(), pat) for pat in patterns)
    )
    if not files:
        raise FileNotFoundError(f"{folder}: no parquet file matches {list(patterns)}")
    records: list[dict[str, Any]] = []
    for path in files:
        names = pq.read_schema(path).names
        missing = {"id", "description"} - set(names)
        if missing:
            raise ValueError(f"{path.name}: no column {sorted(missing)} (format codeforces_statements); has {names}")
        records += pq.read_table(path, columns=[c for c in STATEMENT_COLUMNS if c in names]).to_pylist()
    return records


def download_statements(name: str, spec: Mapping[str, Any], folder: str | Path, out: str) -> dict[str, int]:
    """Corpus `name` (format codeforces_statements) from its downloaded snapshot `folder` to `out` as statement
    rows; returns the counts (records, kept, dropped by reason)."""
    rows, counts = statements(read_statement_records(folder, spec["files"]))
    if not rows:
        raise ValueError(f"corpora.{name}: none of the {counts['records']} records is a usable statement ({counts})")
    lt.write_jsonl(out, rows)
    return counts


# --- annotators ---------------------------------------------------------------------------------------------------


def _unit(salt: str, ident: str) -> float:
    """A uniform number in [0, 1) fixed by (salt, problem id)."""
    return int(hashlib.sha256(f"{salt}:{ident}".encode()).hexdigest()[:15], 16) / 16**15


def assign(rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each annotator's share of the statements (which statement went to which of the four models is not
    published). With `max_statements` set, the statements whose hash u0 = H(seed, "subset", id) is smallest are
    kept (a uniform subset); each kept one goes to the annotator whose interval of the cumulative shares holds
    u1 = H(seed, "annotator", id). Both depend only on the ids, not on the file order; each share keeps the
    rows' order."""
    annotators = settings["annotators"]
    seed = int(settings["seed"])
    chosen = list(rows)
    if settings.get("max_statements") is not None:
        order = sorted(range(len(chosen)), key=lambda i: _unit(f"{seed}:subset", chosen[i]["id"]))
        keep = set(order[: int(settings["max_statements"])])
        chosen = [r for i, r in enumerate(chosen) if i in keep]
    total = float(sum(float(a["share"]) for a in annotators.values()))
    bounds, acc = [], 0.0
    for name, a in annotators.items():
        acc += float(a["share"]) / total
        bounds.append((acc, name))
    shares: dict[str, list[dict[str, Any]]] = {name: [] for name in annotators}
    for r in chosen:
        u = _unit(f"{seed}:annotator", r["id"])
        shares[next((n for b, n in bounds if u < b), bounds[-1][1])].append(dict(r))
    return shares


def job_vllm(vllm: Mapping[str, Any], annotator: Mapping[str, Any]) -> dict[str, Any]:
    """The `vllm` block of an annotate job: tensor parallel over the annotator's GPUs, its own context length."""
    return {**vllm, "tensor_parallel_size": int(annotator["gpus"]), "max_model_len": int(annotator["max_model_len"])}


# --- prompts and parsing ------------------------------------------------------------------------------------------


def concepts_message(problem: str, n_concepts: int) -> str:
    """Request 1: the foundational concepts behind a problem, as a numbered list between the concept markers."""
    return (
        "You are an expert competitive programmer and problem setter. Read the programming problem below and name "
        f"the {n_concepts} most important foundational concepts (algorithms, data structures, mathematical facts "
        "or techniques) that a solver must know to solve it. Name each concept in a short phrase, general enough to "
        "be reused for other problems.\n\n"
        f"Problem:\n{problem}\n\n"
        f"Answer with a numbered list, one concept per line, between the line {CONCEPTS[0]} and the line "
        f"{CONCEPTS[1]}, and nothing else after it."
    )


def rationale_message(problem: str, concepts: Sequence[str], difficulty: str) -> str:
    """Request 2: the rationale, the plan by which a problem designer builds exactly this problem from these
    concepts at this difficulty, between the rationale markers that q and p use (llm_text.RATIONALE)."""
    listed = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(concepts))
    return (
        "You are an expert competitive-programming problem setter. Below are foundational concepts, a difficulty "
        "level and a problem built on them. Reconstruct the designer's thinking: write the step-by-step plan by "
        "which another problem setter, given only these concepts and this difficulty level, would arrive at "
        "exactly this problem (how the concepts are chosen and combined, the core idea, the constraints and why "
        "they fit the difficulty, and how the statement is framed). Do not solve the problem.\n\n"
        f"{lt.CONCEPTS_HEAD}\n{listed}\n\n{lt.DIFFICULTY_HEAD} {difficulty}\n\nProblem:\n{problem}\n\n"
        f"Write the plan between the line {lt.RATIONALE[0]} and the line {lt.RATIONALE[1]}."
    )


def parse_concepts(text: str, finish_reason: str | None, settings: Mapping[str, Any]) -> tuple[list[str] | None, str]:
    """(concepts, "ok") from an answer to request 1: the numbered or bulleted items between the concept markers,
    duplicates dropped, the first `max_concepts` kept; else (None, the drop reason): no marked span
    ("concepts_truncated" when the answer was cut at max_tokens), fewer than `min_concepts` items."""
    start, end = text.find(CONCEPTS[0]), text.find(CONCEPTS[1])
    if start < 0 or end < start:
        return None, "concepts_truncated" if finish_reason == "length" else "concepts_unmarked"
    items = []
    for line in text[start + len(CONCEPTS[0]) : end].splitlines():
        match = _ITEM.match(line)
        item = match.group(1).strip().rstrip(".") if match else ""
        if item and item.lower() not in {x.lower() for x in items}:
            items.append(item)
    if len(items) < int(settings["min_concepts"]):
        return None, "too_few_concepts"
    return items[: int(settings["max_concepts"])], "ok"


def parse_rationale(text: str, finish_reason: str | None) -> tuple[str | None, str]:
    """(rationale, "ok") from an answer to request 2: the text between the rationale markers; else (None, reason):
    "rationale_truncated" (cut at max_tokens before the end marker), "rationale_unmarked", "rationale_empty"."""
    start, end = text.find(lt.RATIONALE[0]), text.find(lt.RATIONALE[1])
    if start < 0 or end < start:
        return None, "rationale_truncated" if finish_reason == "length" else "rationale_unmarked"
    body = text[start + len(lt.RATIONALE[0]) : end].strip()
    return (body, "ok") if body else (None, "rationale_empty")


# --- the annotate job ---------------------------------------------------------------------------------------------


def annotate(
    annotator: str,
    model_folder: str,
    statements_path: str,
    settings: Mapping[str, Any],
    vllm: Mapping[str, Any],
    out: str,
    out_summary: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """Annotator `annotator`'s job: its share of the statements (`assign`), served by vLLM from `model_folder`
    (the annotator's GPUs, tensor parallel), request 1 (concepts) for each, request 2 (rationale) for each whose
    concepts parse. Writes the kept triples {"concepts", "difficulty", "rationale", "problem", "domain": "code",
    "annotator", "id", "rating", "tags"} to `out` and the counts (share, kept, dropped by reason) to
    `out_summary`; returns the counts. With `journal` (a file in the job's checkpoint folder) every answer of both
    requests is journalled as it finishes and a rerun asks only for the rest (vllm_server.chat_each)."""
    from paperflow.promptscale.vllm_server import chat_each, journal_at, served

    spec = settings["annotators"][annotator]
    share = assign(lt.read_jsonl(statements_path), settings)[annotator]
    sampling = dict(
        n=1,
        temperature=float(settings["temperature"]),
        top_p=float(settings["top_p"]),
        seed=int(settings["seed"]),
    )
    dropped: Counter[str] = Counter()
    kept = []
    with (
        journal_at(journal) as done,
        served(model_folder, annotator, job_vllm(vllm, spec), server_log, spec["dtype"]) as client,
    ):
        first = chat_each(
            client,
            [concepts_message(r["problem"], int(settings["max_concepts"])) for r in share],
            max_tokens=int(settings["max_concept_tokens"]),
            journal=done,
            tag="concepts:",
            **sampling,
        )
        with_concepts = []
        for r, (choice,) in zip(share, first):
            concepts, why = parse_concepts(choice["text"], choice["finish_reason"], settings)
            if concepts is None:
                dropped[why] += 1
            else:
                with_concepts.append({**r, "concepts": concepts})
        second = chat_each(
            client,
            [rationale_message(r["problem"], r["concepts"], r["difficulty"]) for r in with_concepts],
            max_tokens=int(settings["max_rationale_tokens"]),
            journal=done,
            tag="rationale:",
            **sampling,
        )
    for r, (choice,) in zip(with_concepts, second):
        rationale, why = parse_rationale(choice["text"], choice["finish_reason"])
        if rationale is None:
            dropped[why] += 1
            continue
        kept.append(
            {
                "concepts": r["concepts"],
                "difficulty": r["difficulty"],
                "rationale": rationale,
                "problem": r["problem"],
                "domain": "code",
                "annotator": annotator,
                "id": r["id"],
                "rating": r["rating"],
                "tags": r["tags"],
            }
        )
    lt.write_jsonl(out, kept)
    summary = {
        "annotator": annotator,
        "hub": spec["hub"],
        "share": len(share),
        "kept": len(kept),
        "dropped": {reason: dropped.get(reason, 0) for reason in DROP_REASONS},
    }
    Path(out_summary).parent.mkdir(parents=True, exist_ok=True)
    Path(out_summary).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def check_settings(cfg: Mapping[str, Any], source: str) -> None:
    """What the schema cannot state about the code seeds (paper scale): with `code` among `seeds_data.domains`, the
    `annotate` block is there, its corpus is a `corpora` entry of format codeforces_statements, and
    min_concepts <= max_concepts. Raises paperflow.core.config.ConfigError naming the key."""
    from paperflow.core.config import ConfigError

    if "code" not in cfg.get("seeds_data", {}).get("domains", ["math"]):
        return
    if "annotate" not in cfg:
        raise ConfigError(f"{source}: seeds_data.domains has code but there is no annotate block")
    settings = cfg["annotate"]
    corpus = cfg.get("corpora", {}).get(settings["corpus"])
    if corpus is None or corpus["format"] not in STATEMENT_FORMATS:
        raise ConfigError(
            f"{source}: annotate.corpus = {settings['corpus']!r} needs a corpora entry of format {STATEMENT_FORMATS}"
        )
    if int(settings["min_concepts"]) > int(settings["max_concepts"]):
        raise ConfigError(f"{source}: annotate.min_concepts exceeds annotate.max_concepts")
    if "code" not in cfg["seeds_data"]:
        raise ConfigError(f"{source}: seeds_data.code (the code seeds' n_train and n_heldout) is missing")
