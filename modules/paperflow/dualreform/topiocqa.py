"""Paper-scale data (spec section 4): TopiOCQA's conversations and its Wikipedia passage corpus, read from the Hub's
files into the tables the smoke path uses, and BM25 over the corpus.

- Conversations (`McGill-NLP/TopiOCQA`, `data/topiocqa_{train,valid}.jsonl`): one JSON record per turn with
  `Conversation_no`, `Turn_no`, `Question`, `Answer`, `Context` (the earlier questions and answers, alternating) and
  `Gold_passage` (`id`, `title`, `text`); the validation split is the test split (spec section 4: dev used as test).
- Corpus (`McGill-NLP/TopiOCQA-wiki-corpus`, `data/train-*.parquet`): `id`, `title`, `sub_title`, `contents`; the
  gold passages' ids are corpus ids. A passage's text is "title sub_title contents".
- Turns table: split, conv, turn, query, response, hist_queries, hist_responses, gold_pid (the smoke turns table's
  columns that exist for real data; TopiOCQA has no human rewrites, so the SFT-only baseline is not run here).
- Candidates: none here. The CQR model writes them (paperflow.dualreform.paper.train: K samples per training query
  with paperflow.dualreform.writer, each ranked by BM25 over the corpus with the index preprocess saves).
- BM25: bm25s (Robertson's BM25, k1, b) over lower-cased word tokens with English stopwords removed (bm25s's own
  Tokenizer, the corpus held as token ids); the top DEPTH passages of a query come from bm25s's `retrieve` (no full
  score matrix over 25.7M passages).
- The index is preprocess's output (a folder, INDEX_DONE written last): train and evaluate load it (CorpusBM25.open)
  instead of indexing the corpus again.
- Resume (README, "Long jobs resume"): given the job's checkpoint folder, preprocess saves the index there once built
  (bm25s's own save, with the Tokenizer's vocabulary and stopwords) and a rerun loads it instead of tokenising and
  indexing the corpus again, then copies it to its output folder; the responses' retrieval goes in batches of
  BATCH_TURNS turns, each batch's pids and scores a row of a `RowJournal`, so a rerun retrieves only the batches it
  lacks. A query's top passages do not depend on the other queries of its call, so the table is the one an
  uninterrupted run writes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

CONVERSATION_FILES = {"train": "data/topiocqa_train.jsonl", "test": "data/topiocqa_valid.jsonl"}
CORPUS_PATTERN = "data/train-*.parquet"
CORPUS_COLUMNS = ("id", "title", "sub_title", "contents")
TURN_KEYS = ("Conversation_no", "Turn_no", "Question", "Answer", "Context", "Gold_passage")
BATCH_TURNS = 4096  # turns per journalled retrieval batch of preprocess (2 queries each, top 1)
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
            self._load(folder)
            return
        self._bm25 = bm25s.BM25(k1=k1, b=b, method="robertson")
        corpus = self._tokenizer.tokenize(list(texts), return_as="tuple", show_progress=False)
        self._bm25.index(corpus, show_progress=False)
        if folder is not None:
            self._save(folder, {"n_docs": self.n_docs, "k1": float(k1), "b": float(b)})

    def _load(self, folder: Path) -> None:
        import bm25s

        self._bm25 = bm25s.BM25.load(str(folder), show_progress=False)
        self._tokenizer.load_vocab(str(folder))
        self._tokenizer.load_stopwords(str(folder))

    @classmethod
    def open(cls, folder: str | Path, threads: int = 1) -> CorpusBM25:
        """The index saved in `folder` (preprocess's output), without the corpus; refused when its INDEX_DONE marker
        is missing (a save that did not finish)."""
        from bm25s.tokenization import Tokenizer

        folder = Path(folder)
        if not (folder / INDEX_DONE).exists():
            raise FileNotFoundError(f"{folder}: no {INDEX_DONE}; not a finished saved index (run preprocess)")
        self = cls.__new__(cls)
        self.n_docs = int(json.loads((folder / INDEX_DONE).read_text())["n_docs"])
        self.threads, self.loaded = int(threads), True
        self._tokenizer = Tokenizer(stopwords="en")
        self._load(folder)
        return self

    @staticmethod
    def publish(saved: str | Path, folder: str | Path) -> Path:
        """A saved index folder copied into `folder` (an output), its INDEX_DONE marker copied last; returns the
        marker's path there."""
        saved, folder = Path(saved), Path(folder)
        if not (saved / INDEX_DONE).exists():
            raise FileNotFoundError(f"{saved}: no {INDEX_DONE}; not a finished saved index")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / INDEX_DONE).unlink(missing_ok=True)
        for f in sorted(saved.iterdir()):
            if f.is_dir():
                shutil.copytree(f, folder / f.name, dirs_exist_ok=True)
            elif f.name != INDEX_DONE:
                shutil.copy2(f, folder / f.name)
        shutil.copy2(saved / INDEX_DONE, folder / INDEX_DONE)
        return folder / INDEX_DONE

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


def reference_table(turns: pd.DataFrame, index: CorpusBM25, journal=None, batch: int | None = None) -> pd.DataFrame:
    """The turns with the top passage of each raw response (`r_raw_top1`: claims.raw_response_hits) and of the
    response followed by its question (`r_single_top1`: the single-role refiner's pseudo reference, no model).

    `journal` (a `RowJournal` keyed by "start", in the job's checkpoint folder): the turns are retrieved in batches
    of `batch` (None: BATCH_TURNS), each batch's pids and scores appended as a row, and a rerun retrieves only the
    batches not there. None: every query in one call."""
    table = turns.copy()
    kinds = {
        "r_raw_top1": list(table["response"]),
        "r_single_top1": [f"{r} {q}" for r, q in zip(table["response"], table["query"])],
    }
    n = len(table)
    if journal is None:
        for col, queries in kinds.items():
            table[col] = index.top(queries, 1)[:, 0] if n else np.zeros(0, dtype=np.int64)
        return table
    size = max(1, int(BATCH_TURNS if batch is None else batch))
    starts = list(range(0, n, size))
    for s in journal.todo(starts, key=lambda start: start):
        e = min(s + size, n)
        row = {"start": s, "stop": e}
        for col, queries in kinds.items():
            top, scores = index.scored(queries[s:e], 1)
            row |= {col: top[:, 0].tolist(), f"{col}_score": scores[:, 0].tolist()}
        journal.append(row)
    rows = journal.complete(starts)
    for s, row in zip(starts, rows):
        if row["stop"] != min(s + size, n):
            raise ValueError(
                f"{journal.path}: batch {s} ends at {row['stop']}, not {min(s + size, n)} (another batch size)"
            )
    for col in kinds:
        table[col] = np.asarray([p for r in rows for p in r[col]], dtype=np.int64)
    return table
