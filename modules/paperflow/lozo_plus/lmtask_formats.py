"""The formats of the paper-scale tasks trained with the LM loss (spec section 4: COPA, ReCoRD, SQuAD, DROP, as
MeZO's `templates.py` writes them; see paperflow.lozo_plus.lmtasks): the Hub columns each reads, its prompt, its
candidate completions or gold answers and its training completion. Plain Python, so the paper-scale config check
(superglue.check_tasks, run while Snakemake builds the DAG) imports no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

CHOICE, GENERATE = "choice", "generate"


@dataclass(frozen=True)
class LMTask:
    """A task trained with the LM loss: its kind, the Hub columns it reads, the prompt, the candidate completions
    (choice) or gold answers (generate), the gold candidates' indices (choice) and the training completion."""

    kind: str
    columns: tuple[str, ...]
    prompt: Callable[[Mapping[str, Any]], str]
    candidates: Callable[[Mapping[str, Any]], list[str]]
    gold: Callable[[Mapping[str, Any]], list[int]]
    target: Callable[[Mapping[str, Any]], str]
    metric: str = "accuracy"


def _copa_prompt(r) -> str:
    premise = r["premise"].rstrip()
    premise = premise[:-1] if premise.endswith(".") else premise
    conj = {"effect": " so ", "cause": " because "}.get(r["question"])
    if conj is None:
        raise ValueError(f"copa: question {r['question']!r} is neither 'cause' nor 'effect'")
    return premise + conj


def _copa_choice(c: str) -> str:
    words = c.split(" ")
    if words[0] != "I":
        words[0] = words[0].lower()
    return " ".join(words)


def _record_passage(r) -> str:
    return r["passage"].replace("@highlight\n", "- ") + "\n-"


def _record_fill(r, entity: str) -> str:
    return " " + r["query"].replace("@placeholder", entity)


def _record_entities(r) -> list[str]:
    return [str(e) for e in r["entities"]]


def _record_gold(r) -> list[int]:
    answers = {str(a) for a in r["answers"]}
    return [i for i, e in enumerate(_record_entities(r)) if e in answers]


def _answers(r, task: str) -> list[str]:
    out = list(r["answers"]["text"]) if task == "squad" else list(r["answers_spans"]["spans"])
    out = [str(a) for a in out]
    if not out:
        raise ValueError(f"{task}: a question without an answer")
    return out


LM_TASKS = {
    # super_glue copa: premise, choice1, choice2, question (cause | effect), idx, label (0: choice1, 1: choice2)
    "copa": LMTask(
        CHOICE,
        ("premise", "choice1", "choice2", "question", "label"),
        _copa_prompt,
        lambda r: [_copa_choice(r["choice1"]), _copa_choice(r["choice2"])],
        lambda r: [int(r["label"])],
        lambda r: _copa_choice(r[f"choice{int(r['label']) + 1}"]),
    ),
    # super_glue record: passage, query, entities, entity_spans, answers, idx
    "record": LMTask(
        CHOICE,
        ("passage", "query", "entities", "answers"),
        _record_passage,
        lambda r: [_record_fill(r, e) for e in _record_entities(r)],
        _record_gold,
        lambda r: _record_fill(r, str(r["answers"][0])),
    ),
    # rajpurkar/squad plain_text: id, title, context, question, answers {text, answer_start}
    "squad": LMTask(
        GENERATE,
        ("title", "context", "question", "answers"),
        lambda r: f"Title: {r['title']}\nContext: {r['context']}\nQuestion: {r['question'].strip()}\nAnswer:",
        lambda r: _answers(r, "squad"),
        lambda r: [],
        lambda r: f" {_answers(r, 'squad')[0]}\n",
        metric="f1",
    ),
    # ucinlp/drop: section_id, query_id, passage, question, answers_spans {spans, types}
    "drop": LMTask(
        GENERATE,
        ("passage", "question", "answers_spans"),
        lambda r: f"Passage: {r['passage']}\nQuestion: {r['question'].strip()}\nAnswer:",
        lambda r: _answers(r, "drop"),
        lambda r: [],
        lambda r: f" {_answers(r, 'drop')[0]}\n",
        metric="f1",
    ),
}
