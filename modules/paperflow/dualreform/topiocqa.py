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
- Resume (README, "Long jobs resume"): given the job's checkpoint folder, the index is saved there once built (bm25s's
  own save, with the Tokenizer's vocabulary and stopwords) and a rerun loads it instead of tokenising and indexing the
  corpus again; the retrieval goes in batches of BATCH_TURNS turns, each batch's candidate pids and scores a row of a
  `RowJournal`, so a rerun retrieves only the batches it lacks. A query's top passages do not depend on the other
  queries of its call, so the table is the one an uninterrupted run writes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

TEMPLATES = ("raw", "prev_question", "first_question", "all_questions", "prev_turn", "all_turns")
CONVERSATION_FILES = {"train": "data/topiocqa_train.jsonl", "test": "data/topiocqa_valid.jsonl"}
CORPUS_PATTERN = "data/train-*.parquet"
CORPUS_COLUMNS = ("id", "title", "sub_title", "contents")
TURN_KEYS = ("Conversation_no", "Turn_no", "Question", "Answer", "Context", "Gold_passage")
BATCH_TURNS = 512  # turns per journalled retrieval batch (12 queries each: 6 rewrites at DEPTH, 6 refinements at 1)
INDEX_DONE = "paperflow-index.json"  # written last into a saved index folder: the save finished


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
    (a word the corpus lacks is dropped; a query left empty scores 0 everywhere). `top(queries, k)` gives pids.

    `folder` (a folder in the job's checkpoint folder): when it holds an index saved by an earlier run (its
    INDEX_DONE marker written last) the index and the Tokenizer's vocabulary are loaded from it and the corpus is not
    tokenised again; otherwise the index is built and saved there. None: built in memory only (as before)."""

    def __init__(self, texts: Sequence[str], k1: float, b: float, threads: int = 1, folder: str | Path | None = None):
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.n_docs = len(texts)
        self.threads = int(threads)
        self._tokenizer = Tokenizer(stopwords="en")
        folder = Path(folder) if folder is not None else None
        self.loaded = folder is not None and (folder / INDEX_DONE).exists()
        if self.loaded:
            marker = json.loads((folder / INDEX_DONE).read_text())
            if marker != {"n_docs": self.n_docs, "k1": float(k1), "b": float(b)}:
                raise ValueError(f"{folder}: a saved index of {marker}, not of {self.n_docs} passages, k1 {k1}, b {b}")
            self._bm25 = bm25s.BM25.load(str(folder), show_progress=False)
            self._tokenizer.load_vocab(str(folder))
            self._tokenizer.load_stopwords(str(folder))
            return
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="robertson")
        corpus = self._tokenizer.tokenize(list(texts), return_as="tuple", show_progress=False)
        self._bm25.index(corpus, show_progress=False)
        if folder is not None:
            self._save(folder, {"n_docs": self.n_docs, "k1": float(k1), "b": float(b)})

    def _save(self, folder: Path, marker: dict) -> None:
        """The index and the Tokenizer's vocabulary into `folder`, through a scratch folder renamed when complete."""
        scratch = folder.with_name(folder.name + ".part")
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)  # an index folder without its marker: a save cut off
        self._bm25.save(str(scratch), show_progress=False)
        self._tokenizer.save_vocab(str(scratch))
        self._tokenizer.save_stopwords(str(scratch))
        (scratch / INDEX_DONE).write_text(json.dumps(marker, sort_keys=True))
        os.replace(scratch, folder)

    def scored(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """([n_queries, k] best pids first, their BM25 scores)."""
        k = min(int(k), self.n_docs)
        ids = self._tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        docs, scores = self._bm25.retrieve(ids, k=k, show_progress=False, n_threads=self.threads)
        return np.asarray(docs, dtype=np.int64), np.asarray(scores, dtype=np.float32)

    def top(self, queries: Sequence[str], k: int) -> np.ndarray:
        """[n_queries, k] best pids first."""
        return self.scored(queries, k)[0]


def candidate_table(
    turns: pd.DataFrame, index: CorpusBM25, depth: int, journal=None, batch: int | None = None
) -> pd.DataFrame:
    """The smoke path's candidate table for real turns: qcands with the top-`depth` pids of each and the gold
    passage's rank (depth + 1 when not in them), rcands with the top pid of each.

    `journal` (a `RowJournal` keyed by "start", in the job's checkpoint folder): the turns are retrieved in batches
    of `batch` (None: BATCH_TURNS), each batch's pids and scores appended as a row, and a rerun retrieves only the
    batches not there.
    None: every query in one call (as before)."""
    table = turns.copy()
    table["qcands"] = [
        candidates(q, h, a) for q, h, a in zip(table["query"], table["hist_queries"], table["hist_responses"])
    ]
    table["rcands"] = [
        candidates(r, [*h, q], a)
        for q, r, h, a in zip(table["query"], table["response"], table["hist_queries"], table["hist_responses"])
    ]
    n, k = len(table), len(TEMPLATES)
    qcands = [c for cs in table["qcands"] for c in cs]
    rcands = [c for cs in table["rcands"] for c in cs]
    if journal is None:
        top = index.top(qcands, depth).reshape(n, k, -1)
        r_top1 = index.top(rcands, 1).reshape(n, k)
    else:
        top, r_top1 = _journalled_top(qcands, rcands, n, index, depth, journal, batch)
    hit = top == table["gold_pid"].to_numpy()[:, None, None]
    table["q_top"] = [t.tolist() for t in top]
    table["q_gold_rank"] = np.where(hit.any(-1), hit.argmax(-1) + 1, top.shape[-1] + 1).tolist()
    table["r_top1"] = r_top1.tolist()
    return table


def _journalled_top(qcands, rcands, n: int, index: CorpusBM25, depth: int, journal, batch: int | None):
    """candidate_table's retrieval in journalled batches of turns: ([n, 6, depth] pids, [n, 6] top pids)."""
    k, batch = len(TEMPLATES), max(1, int(BATCH_TURNS if batch is None else batch))
    starts = list(range(0, n, batch))
    for s in journal.todo(starts, key=lambda start: start):
        e = min(s + batch, n)
        q_top, q_scores = index.scored(qcands[s * k : e * k], depth)
        r_top, r_scores = index.scored(rcands[s * k : e * k], 1)
        journal.append(
            {
                "start": s,
                "stop": e,
                "q_top": q_top.tolist(),
                "q_scores": q_scores.tolist(),
                "r_top1": r_top[:, 0].tolist(),
                "r_scores": r_scores[:, 0].tolist(),
            }
        )
    rows = journal.complete(starts)
    for s, row in zip(starts, rows):
        if row["stop"] != min(s + batch, n):
            raise ValueError(
                f"{journal.path}: batch {s} ends at {row['stop']}, not {min(s + batch, n)} (another batch size)"
            )
    if not rows:
        return np.zeros((0, k, min(int(depth), index.n_docs)), dtype=np.int64), np.zeros((0, k), dtype=np.int64)
    top = np.concatenate([np.asarray(r["q_top"], dtype=np.int64) for r in rows])
    r_top1 = np.concatenate([np.asarray(r["r_top1"], dtype=np.int64) for r in rows])
    return top.reshape(n, k, -1), r_top1.reshape(n, k)
