"""Paper-scale data (spec section 4): TopiOCQA's conversations and its Wikipedia passage corpus, read from the Hub's
files into the tables the smoke path uses, the text candidate generator, and BM25 over the corpus.

- Conversations (`McGill-NLP/TopiOCQA`, `data/topiocqa_{train,valid}.jsonl`): one JSON record per turn with
  `Conversation_no`, `Turn_no`, `Question`, `Answer`, `Context` (the earlier questions and answers, alternating) and
  `Gold_passage` (`id`, `title`, `text`); the validation split is the test split (spec section 4: dev used as test).
- Corpus (`McGill-NLP/TopiOCQA-wiki-corpus`, `data/train-*.parquet`): `id`, `title`, `sub_title`, `contents`; the
  gold passages' ids are corpus ids. A passage's text is "title sub_title contents".
- Turns table: split, conv, turn, query, response, hist_queries, hist_responses, gold_pid (the smoke turns table's
  columns that exist for real data; TopiOCQA has no human rewrites, so the SFT-only baseline is not run here).
- Candidates: the LLM candidate generator of the paper (GPT-3.5 rewrites, Llama-3.1 expansions) is replaced by six
  history templates over real text, the same six slots as SynthConvQA's teacher (TEMPLATES): the text itself,
  + the previous question, + the first question, + every earlier question, + the previous question and answer,
  + the whole history. Applied to the response (with the current question closing the history) they are the
  refinement candidates; slot 1 ("+ previous question") is then "+ the current question", the single-role refiner.
- BM25: bm25s (Robertson's BM25, k1, b) over lower-cased word tokens with English stopwords removed (bm25s's own
  Tokenizer, the corpus held as token ids); the top DEPTH passages of a query come from bm25s's `retrieve` (no full
  score matrix over 25.7M passages).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

TEMPLATES = ("raw", "prev_question", "first_question", "all_questions", "prev_turn", "all_turns")
CONVERSATION_FILES = {"train": "data/topiocqa_train.jsonl", "test": "data/topiocqa_valid.jsonl"}
CORPUS_PATTERN = "data/train-*.parquet"
CORPUS_COLUMNS = ("id", "title", "sub_title", "contents")
TURN_KEYS = ("Conversation_no", "Turn_no", "Question", "Answer", "Context", "Gold_passage")


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_corpus(folder: str | Path) -> pd.DataFrame:
    """The corpus shards under a snapshot folder in name order: pid (row), docid, text."""
    files = sorted(Path(folder).glob(CORPUS_PATTERN))
    if not files:
        raise FileNotFoundError(f"{folder}: no file matches {CORPUS_PATTERN!r}")
    frames = []
    for f in files:
        part = pd.read_parquet(f, columns=list(CORPUS_COLUMNS))
        frames.append(
            pd.DataFrame(
                {
                    "docid": part["id"].astype(str),
                    "text": (part["title"] + " " + part["sub_title"] + " " + part["contents"]).str.strip(),
                }
            )
        )
    out = pd.concat(frames, ignore_index=True)
    out.insert(0, "pid", np.arange(len(out), dtype=np.int64))
    return out


def _history(context: Sequence[str]) -> tuple[list[str], list[str]]:
    """TopiOCQA's `Context` (q1, a1, q2, a2, ...) as (questions, answers)."""
    if len(context) % 2:
        raise ValueError(f"a turn's Context has {len(context)} entries; questions and answers alternate")
    return [str(c) for c in context[0::2]], [str(c) for c in context[1::2]]


def turns_table(records: dict[str, Iterable[dict]], docids: pd.Series) -> tuple[pd.DataFrame, int]:
    """The turns of every split ({split: records}) with their gold passage's pid; turns whose gold passage is not in
    the corpus are dropped (returned: how many)."""
    pid_of = pd.Series(np.arange(len(docids)), index=docids.to_numpy())
    rows, dropped = [], 0
    for split, recs in records.items():
        for r in recs:
            missing = [k for k in TURN_KEYS if k not in r]
            if missing:
                raise ValueError(f"a TopiOCQA {split} record lacks {missing} (has {sorted(r)})")
            gold = str(r["Gold_passage"]["id"])
            if gold not in pid_of.index:
                dropped += 1
                continue
            questions, answers = _history(r["Context"])
            rows.append(
                {
                    "split": split,
                    "conv": f"{split}{int(r['Conversation_no'])}",
                    "turn": int(r["Turn_no"]),
                    "query": str(r["Question"]),
                    "response": str(r["Answer"]),
                    "hist_queries": questions,
                    "hist_responses": answers,
                    "gold_pid": int(pid_of[gold]),
                }
            )
    table = pd.DataFrame(rows).sort_values(["split", "conv", "turn"], kind="stable").reset_index(drop=True)
    return table, dropped


def candidates(text: str, questions: Sequence[str], answers: Sequence[str]) -> list[str]:
    """The six TEMPLATES candidates of `text` (a question, or a response with its question closing `questions`)."""
    prev = questions[-1] if questions else ""
    first = questions[0] if questions else ""
    prev_answer = answers[-1] if len(answers) == len(questions) and answers else ""
    turns = " ".join(f"{q} {a}" for q, a in zip(questions, [*answers, *[""] * (len(questions) - len(answers))]))
    out = [
        text,
        f"{text} {prev}",
        f"{text} {first}",
        f"{text} {' '.join(questions)}",
        f"{text} {prev} {prev_answer}",
        f"{text} {turns}",
    ]
    return [" ".join(c.split()) for c in out]


class CorpusBM25:
    """bm25s's Robertson BM25 over a corpus too large for score matrices: bm25s's Tokenizer (lower case, words of 2+
    characters, English stopwords dropped) gives the corpus token ids once; queries are mapped onto that vocabulary
    (a word the corpus lacks is dropped; a query left empty scores 0 everywhere). `top(queries, k)` gives pids."""

    def __init__(self, texts: Sequence[str], k1: float, b: float, threads: int = 1):
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.n_docs = len(texts)
        self.threads = int(threads)
        self._tokenizer = Tokenizer(stopwords="en")
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="robertson")
        corpus = self._tokenizer.tokenize(list(texts), return_as="tuple", show_progress=False)
        self._bm25.index(corpus, show_progress=False)

    def top(self, queries: Sequence[str], k: int) -> np.ndarray:
        """[n_queries, k] best pids first."""
        k = min(int(k), self.n_docs)
        ids = self._tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        docs, _ = self._bm25.retrieve(ids, k=k, show_progress=False, n_threads=self.threads)
        return np.asarray(docs, dtype=np.int64)


def candidate_table(turns: pd.DataFrame, index: CorpusBM25, depth: int) -> pd.DataFrame:
    """The smoke path's candidate table for real turns: qcands with the top-`depth` pids of each and the gold
    passage's rank (depth + 1 when not in them), rcands with the top pid of each."""
    table = turns.copy()
    table["qcands"] = [
        candidates(q, h, a) for q, h, a in zip(table["query"], table["hist_queries"], table["hist_responses"])
    ]
    table["rcands"] = [
        candidates(r, [*h, q], a)
        for q, r, h, a in zip(table["query"], table["response"], table["hist_queries"], table["hist_responses"])
    ]
    n, k = len(table), len(TEMPLATES)
    top = index.top([c for cs in table["qcands"] for c in cs], depth).reshape(n, k, -1)
    hit = top == table["gold_pid"].to_numpy()[:, None, None]
    table["q_top"] = [t.tolist() for t in top]
    table["q_gold_rank"] = np.where(hit.any(-1), hit.argmax(-1) + 1, top.shape[-1] + 1).tolist()
    table["r_top1"] = index.top([c for cs in table["rcands"] for c in cs], 1).reshape(n, k).tolist()
    return table
