"""The paper-scale benchmarks (spec sections 4 and 8) as lmms-lab lays them out on the Hub: their rows normalised to
one question table (LLaVA-1.5's prompts), and each benchmark's official score computed on CPU from the answers.

Kinds (the `kind` key of a `benchmarks` entry): `gqa` (testdev-balanced, exact match; lmms-lab keeps the questions
and the images in two tables joined on the image id), `pope` (F1 with "yes" positive, averaged over the
adversarial, popular and random splits), `mme` (perception + cognition: per subtask accuracy + accuracy+ over the
image's two questions, summed), `sqa` (ScienceQA-IMG, option-letter accuracy), `textvqa` (VQA soft accuracy
min(#annotators agreeing / 3, 1)) and `mmbench` / `mmbench_cn` (MMBench dev, CircularEval: every question asked once
per option with the options rotated, correct only when every rotation is; the option read from the completion by the
official evaluator's rule matching, no GPT judge). Scores are percentages except MME (points out of 2800), as in
Table 1.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError

KINDS = ("gqa", "pope", "mme", "sqa", "textvqa", "mmbench", "mmbench_cn")
SHORT = "Answer the question using a single word or phrase."  # LLaVA-1.5's eval prompt (POPE, MME, TextVQA)
LETTERS = "ABCDEFGHIJ"
SQA_SUFFIX = "Answer with the option's letter from the given choices directly."
# LLaVA-1.5's MMBench prompts (llava/eval/model_vqa_mmbench.py with --single-pred-prompt, --lang en / cn)
MMBENCH_SUFFIX = {"mmbench": SQA_SUFFIX, "mmbench_cn": "请直接回答选项字母。"}
MMBENCH_OPTIONS = "ABCD"
CIRCULAR = 1_000_000  # MMBench's circular copies carry index + r * 1e6: the base question is index % 1e6
QUESTION_COLUMNS = ["qid", "image", "question", "answers", "category", "group"]


def read_parquet_files(folder: str | Path, patterns: Iterable[str]) -> pd.DataFrame:
    """The rows of every parquet file under `folder` matching `patterns` (the download's allow patterns), in path
    order; none is an error naming the patterns. Question tables and image-only tables (GQA's
    testdev_balanced_images: id, image) are told apart by their columns, and the images joined to the questions on
    `imageId`."""
    files = sorted({p for pat in patterns for p in Path(folder).glob(pat) if p.suffix == ".parquet"})
    if not files:
        raise FileNotFoundError(f"no parquet file under {folder} matches {list(patterns)} (the benchmark's `files`)")
    frames = [pd.read_parquet(f) for f in files]
    images = [f for f in frames if "question" not in f.columns]
    rows = pd.concat([f for f in frames if "question" in f.columns], ignore_index=True)
    if not images:
        return rows
    table = pd.concat(images, ignore_index=True).drop_duplicates("id").set_index("id")["image"]
    missing = ~rows["imageId"].isin(table.index)
    if missing.any():
        raise ValueError(f"{int(missing.sum())} questions name an imageId absent from the image table under {folder}")
    return rows.assign(image=rows["imageId"].map(table).to_numpy())


def _image_bytes(cell) -> bytes:
    """The encoded image of a Hub `Image` column cell ({'bytes', 'path'})."""
    if isinstance(cell, dict) and cell.get("bytes") is not None:
        return bytes(cell["bytes"])
    if isinstance(cell, bytes | bytearray):
        return bytes(cell)
    raise ValueError(f"an image cell without bytes: {type(cell).__name__}")


def questions(kind: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One row per question: qid, image (encoded bytes), question (the prompt text after the image), answers (JSON
    list of accepted answers), category (the split / subtask a score groups by), group (MME's image pairing)."""
    if kind == "gqa":
        qid = rows["id"].astype(str)
        out = dict(qid=qid, question=rows["question"].str.strip() + "\n" + SHORT,
                   answers=[json.dumps([str(a).strip().lower()]) for a in rows["answer"]], category="gqa",
                   group=qid)  # fmt: skip
    elif kind == "pope":
        qid = rows["category"].astype(str) + "/" + rows["question_id"].astype(str)  # ids repeat across the splits
        out = dict(qid=qid, question=rows["question"].str.strip() + "\n" + SHORT,
                   answers=[json.dumps([a.strip().lower()]) for a in rows["answer"]],
                   category=rows["category"].astype(str), group=qid)  # fmt: skip
    elif kind == "mme":
        name = rows["question_id"].astype(str)
        out = dict(qid=name + "#" + pd.Series(np.arange(len(rows)), index=rows.index).astype(str),
                   question=rows["question"].str.strip() + "\n" + SHORT,
                   answers=[json.dumps([a.strip().lower()]) for a in rows["answer"]],
                   category=rows["category"].astype(str), group=rows["category"].astype(str) + "/" + name)  # fmt: skip
    elif kind == "sqa":
        rows = rows[rows["image"].notna()]
        out = dict(qid=pd.Series(rows.index, index=rows.index).astype(str),
                   question=[sqa_prompt(q, list(c), h) for q, c, h in zip(rows["question"], rows["choices"], rows["hint"])],
                   answers=[json.dumps([LETTERS[int(a)]]) for a in rows["answer"]],
                   category=rows.get("category", pd.Series("sqa", index=rows.index)).astype(str),
                   group=pd.Series(rows.index, index=rows.index).astype(str))  # fmt: skip
    elif kind in MMBENCH_SUFFIX:
        return mmbench_questions(kind, rows)
    elif kind == "textvqa":
        qid = rows["question_id"].astype(str)
        out = dict(qid=qid, question=rows["question"].str.strip() + "\n" + SHORT,
                   answers=[json.dumps([str(a) for a in ans]) for ans in rows["answers"]],
                   category="textvqa", group=qid)  # fmt: skip
    else:
        raise ConfigError(f"benchmark kind {kind!r} is not one of {', '.join(KINDS)}")
    frame = pd.DataFrame(out).reset_index(drop=True)
    frame.insert(1, "image", [_image_bytes(c) for c in rows["image"]])
    return frame[QUESTION_COLUMNS]


def sqa_prompt(question: str, choices: list[str], hint: str | None) -> str:
    """LLaVA-1.5's ScienceQA prompt: the context (the hint), the question, lettered options, the letter instruction."""
    context = f"Context: {hint.strip()}\n" if isinstance(hint, str) and hint.strip() else ""
    options = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return f"{context}{question.strip()}\n{options}\n{SQA_SUFFIX}"


def is_none(value) -> bool:
    """An empty MMBench cell (LLaVA's `is_none`): None, NaN, or the strings 'nan' / 'none'."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return True
    return isinstance(value, str) and value.strip().lower() in ("nan", "none")


def mmbench_options(row) -> list[str]:
    """The options A, B, ... of an MMBench row, up to the first empty one (LLaVA's `get_options`)."""
    out = []
    for letter_ in MMBENCH_OPTIONS:
        if letter_ not in row or is_none(row[letter_]):
            break
        out.append(str(row[letter_]))
    return out


def mmbench_prompt(kind: str, question: str, hint, options: list[str]) -> str:
    """LLaVA-1.5's MMBench prompt: the hint (when present) and the question, the options lettered A, B, ... in the
    order given, then the letter instruction (each joined by a newline)."""
    text = str(question) if is_none(hint) else f"{hint}\n{question}"
    for letter_, option in zip(MMBENCH_OPTIONS, options):
        text += f"\n{letter_}. {option}"
    return f"{text}\n{MMBENCH_SUFFIX[kind]}"


def rotations(options: list[str], answer: str) -> list[tuple[list[str], str]]:
    """CircularEval's passes of one question: for r = 0 .. n - 1 the options rotated left by r (LLaVA's
    `options[1:] + options[:1]` per round) and the letter the correct option then carries."""
    n = len(options)
    correct = MMBENCH_OPTIONS.index(answer)
    if correct >= n:
        raise ValueError(f"answer {answer!r} names no option of {options}")
    return [(options[r:] + options[:r], MMBENCH_OPTIONS[(correct - r) % n]) for r in range(n)]


def mmbench_questions(kind: str, rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (question, rotation) of MMBench's base questions (index < 1e6; the Hub's circular copies, index +
    r * 1e6, are dropped and the rotations rebuilt here so that each pass's letter is known): qid `index/r`,
    answers = JSON [correct letter, {letter: option text}] (the text for the scorer's option matching), group =
    the base index (CircularEval's unit), category = MMBench's ability category."""
    base = rows[rows["index"].astype(int) < CIRCULAR]
    out = []
    for _, row in base.iterrows():
        index = int(row["index"])
        for r, (options, answer) in enumerate(rotations(mmbench_options(row), str(row["answer"]).strip())):
            out.append({
                "qid": f"{index}/{r}", "image": _image_bytes(row["image"]),
                "question": mmbench_prompt(kind, row["question"], row.get("hint"), options),
                "answers": json.dumps([answer, dict(zip(MMBENCH_OPTIONS, options))], ensure_ascii=False),
                "category": str(row["category"]), "group": str(index),
            })  # fmt: skip
    return pd.DataFrame(out, columns=QUESTION_COLUMNS)


# the official evaluator's refusals, read as option Z (VLMEvalKit `can_infer_option`)
REFUSALS = (
    "Sorry, I can't help with images of people yet.",
    "I can't process this file.",
    "I'm sorry, but without the image provided",
    "Cannot determine the answer",
)


def infer_option(prediction: str, choices: dict[str, str]) -> str:
    """The option a completion names, by the rules the official MMBench evaluator (VLMEvalKit `can_infer`) applies
    before its GPT judge: (1) a refusal phrase -> 'Z'; the text with .()[],:;!*#{} turned to spaces and split on
    spaces; exactly one option letter among the words -> that letter, except a lone 'A' in more than three words
    (an article); no letter but a 'Z' word -> 'Z'; (2) else exactly one option whose text (lower case) occurs in the
    completion (lower case) -> its letter; (3) else '' (the GPT judge is not run: the pass counts wrong, as the
    evaluator's exact-matching policy counts it)."""
    text = str(prediction)
    if any(r in text for r in REFUSALS):
        return "Z"
    for ch in ".()[],:;!*#{}":
        text = text.replace(ch, " ")
    words = text.split()
    hits = [c for c in choices if c in words]
    if len(hits) == 1:
        if not ("A" in words and len(words) > 3):
            return hits[0]
    elif not hits and "Z" in words:
        return "Z"
    lowered = str(prediction).lower()
    found = [c for c, option in choices.items() if str(option).lower() in lowered]
    return found[0] if len(found) == 1 else ""


def circular_hits(frame: pd.DataFrame) -> pd.Series:
    """CircularEval per base question (group): True when every rotation's inferred option is its correct letter."""
    parsed = [json.loads(a) for a in frame["answers"]]
    correct = pd.Series(
        [infer_option(p, choices) == truth for p, (truth, choices) in zip(frame["prediction"], parsed)],
        index=frame.index,
    )
    return correct.groupby(frame["group"]).all()


def yes_no(text: str) -> str:
    """'yes' / 'no' from a generated answer (its first word), 'other' when it is neither."""
    words = re.findall(r"[a-z]+", str(text).lower())
    return words[0] if words and words[0] in ("yes", "no") else "other"


def letter(text: str) -> str:
    """The option letter a generated answer starts with ('A', '(B)', 'C.'), '' when none."""
    m = re.match(r"^\s*\(?([A-J])\b", str(text))
    return m.group(1) if m else ""


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def normalise_answer(text: str) -> str:
    """VQA answer normalisation (lower case, punctuation and articles dropped, spaces collapsed)."""
    return " ".join(_ARTICLES.sub(" ", _PUNCT.sub("", str(text).lower())).split())


def exact_answer(text: str) -> str:
    """GQA's exact match: lower case, punctuation dropped, outer spaces stripped."""
    return _PUNCT.sub("", str(text).lower()).strip()


def vqa_accuracy(prediction: str, answers: list[str]) -> float:
    """VQA soft accuracy (spec section 8): min(#annotators giving the predicted answer / 3, 1)."""
    pred = normalise_answer(prediction)
    return min(sum(normalise_answer(a) == pred for a in answers) / 3.0, 1.0)


def f1_yes(pred: pd.Series, truth: pd.Series) -> float:
    tp = float(((pred == "yes") & (truth == "yes")).sum())
    fp = float(((pred == "yes") & (truth == "no")).sum())
    fn = float(((pred != "yes") & (truth == "yes")).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp > 0 else 0.0


def score(kind: str, frame: pd.DataFrame) -> float:
    """The benchmark's score of one answers table (columns prediction, answers, category, group)."""
    truth = frame["answers"].map(lambda a: json.loads(a)[0])
    if kind == "gqa":
        return 100 * float((frame["prediction"].map(exact_answer) == truth.map(exact_answer)).mean())
    if kind == "pope":
        pred = frame["prediction"].map(yes_no)
        return 100 * float(np.mean([f1_yes(pred[i], truth[i]) for i in frame.groupby("category").groups.values()]))
    if kind == "mme":
        correct = frame["prediction"].map(yes_no) == truth
        total = 0.0
        for _, idx in frame.groupby("category").groups.items():
            acc = float(correct[idx].mean())
            acc_plus = float(correct[idx].groupby(frame["group"][idx]).all().mean())
            total += 100 * (acc + acc_plus)
        return total
    if kind == "sqa":
        return 100 * float((frame["prediction"].map(letter) == truth).mean())
    if kind in MMBENCH_SUFFIX:
        return 100 * float(circular_hits(frame).mean())
    if kind == "textvqa":
        return 100 * float(
            np.mean([vqa_accuracy(p, json.loads(a)) for p, a in zip(frame["prediction"], frame["answers"])])
        )
    raise ConfigError(f"benchmark kind {kind!r} is not one of {', '.join(KINDS)}")
