"""ESConv at paper scale: PPDPP's split files (one JSON dialogue per line: emotion_type, problem_type, situation,
dialog [{text, speaker: sys|usr, strategy}]) read into cases, and the situation vocabulary UKA's memories index.

A case is what the simulator plays: the seeker's emotion, problem and situation, and the first thing the seeker
said in the ESConv dialogue (the conversation's opening, as in PPDPP and PRINCIPLES). A situation is (phase of the
dialogue, emotion, problem, last feedback class) over the emotions and problems that occur in the cases; its text
and every (situation, need) text are embedded once by the preprocess stage, exactly as NeedWorld's are at smoke
scale, so the memories and their retrieval are the same code at both scales.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from paperflow.uka import needworld as nw
from paperflow.uka.memory import Embeddings

CASE_COLUMNS = ["split", "case", "emotion", "problem", "situation", "first_user", "strategies"]

PHASE_TEXT = {
    "explore": "Early in the conversation.",
    "comfort": "In the middle of the conversation.",
    "action": "Late in the conversation.",
}
FEEDBACK_TEXT = {
    "elaborates": "The seeker just elaborated on the problem.",
    "agrees": "The seeker just agreed with the supporter.",
    "pushes_back": "The seeker just pushed back.",
    "asks_help": "The seeker just asked for help.",
    "short": "The seeker just gave a short answer.",
    None: "The seeker has just opened the conversation.",
}
NEED_TEXT = {
    "validation": "The seeker wants their feelings validated.",
    "understanding": "The seeker wants to be understood.",
    "advice": "The seeker wants practical advice.",
    "information": "The seeker wants information.",
}


def read_cases(path: str | Path, split: str) -> pd.DataFrame:
    """The cases of one PPDPP split file, in file order; a dialogue without a seeker turn is refused."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        d = json.loads(line)
        missing = {"emotion_type", "problem_type", "situation", "dialog"} - set(d)
        if missing:
            raise ValueError(f"{path} line {i + 1}: no {sorted(missing)} (not an ESConv/PPDPP record)")
        first = next((t["text"] for t in d["dialog"] if t.get("speaker") == "usr"), None)
        if first is None:
            raise ValueError(f"{path} line {i + 1}: a dialogue without a seeker ('usr') turn")
        rows.append(
            {
                "split": split,
                "case": len(rows),
                "emotion": d["emotion_type"].strip().lower(),
                "problem": d["problem_type"].strip().lower(),
                "situation": d["situation"].strip(),
                "first_user": first.strip(),
                "strategies": [t["strategy"] for t in d["dialog"] if t.get("speaker") == "sys" and "strategy" in t],
            }
        )
    if not rows:
        raise ValueError(f"{path}: no dialogues")
    return pd.DataFrame(rows, columns=CASE_COLUMNS)


def vocabulary(cases: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The sorted emotions and problems of the cases (the situation axes)."""
    return sorted(set(cases["emotion"])), sorted(set(cases["problem"]))


def situation_index(phase, emotion, problem, last_feedback, n_emotions: int, n_problems: int):
    """The row of a situation in `situation_texts(...)` (vectorised); last_feedback nw.NO_FEEDBACK on a first turn."""
    n_fb = len(nw.FEEDBACK) + 1
    return ((np.asarray(phase) * n_emotions + emotion) * n_problems + problem) * n_fb + last_feedback


def situation_texts(emotions: Sequence[str], problems: Sequence[str]) -> list[str]:
    """Every situation text, in `situation_index` order."""
    return [
        f"{PHASE_TEXT[p]} The seeker feels {e} about {pr}. {FEEDBACK_TEXT[f]}"
        for p in nw.PHASES
        for e in emotions
        for pr in problems
        for f in [*nw.FEEDBACK, None]
    ]


def keyed_texts(emotions: Sequence[str], problems: Sequence[str]) -> list[str]:
    """Every (situation, need) text, row = situation_index * len(NEEDS) + need (UKA's memory keys)."""
    return [f"{s} {NEED_TEXT[z]}" for s in situation_texts(emotions, problems) for z in nw.NEEDS]


def embed_vocabulary(cases: pd.DataFrame, embedding: dict, encode=None) -> pd.DataFrame:
    """The preprocess table (kind, row, text, vector) of every situation and (situation, need) text of the cases'
    vocabulary; `encode(texts) -> [n, D]` (default: MiniLM through the kit's loader, or the hashed fallback)."""
    emotions, problems = vocabulary(cases)
    if encode is None:
        if embedding["kind"] == "minilm":
            from paperflow.core.lm.encoders import encode_sentences

            def encode(texts):
                return encode_sentences(texts, batch_size=int(embedding["batch_size"]), progress=True)
        else:
            from paperflow.uka.memory import hashed_embedding as encode
    rows = []
    for kind, texts in (("situation", situation_texts(emotions, problems)), ("keyed", keyed_texts(emotions, problems))):
        vectors = np.asarray(encode(texts), dtype=np.float32)
        rows.append(pd.DataFrame({"kind": kind, "row": np.arange(len(texts)), "text": texts, "vector": list(vectors)}))
    return pd.concat(rows, ignore_index=True)


def embeddings_from_frame(frame: pd.DataFrame, cases: pd.DataFrame) -> Embeddings:
    """The preprocess table as Embeddings, checked against the cases' vocabulary."""
    emotions, problems = vocabulary(cases)
    parts = {}
    for kind, texts in (("situation", situation_texts(emotions, problems)), ("keyed", keyed_texts(emotions, problems))):
        sub = frame[frame["kind"] == kind].sort_values("row")
        if list(sub["text"]) != texts:
            raise ValueError(f"the {kind} embeddings do not match the cases' vocabulary; rerun preprocess")
        parts[kind] = np.stack(sub["vector"].to_numpy()).astype(np.float32)
    return Embeddings(**parts)
