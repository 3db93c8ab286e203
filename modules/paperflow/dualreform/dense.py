"""The dense retriever of the paper's evaluation (spec section 2 step 7: GTR-T5-large), beside BM25: a
sentence-transformers encoder at a pinned Hub commit, the corpus encoded once (float16 rows in a .npy file, read as a
memory map; with a checkpoint folder, each chunk journalled as it is flushed, so a rerun encodes only the rest),
and exact inner-product search of the chosen rewrites in chunks of passages on the encoder's device.
The rank of the gold passage among the top DEPTH gives the same metrics as BM25's (`retrieval.retrieval_metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def encoder(dense_json: str, dense: Mapping[str, Any], device):
    """The SentenceTransformer downloaded by the dense download rule, offline, on `device`."""
    from sentence_transformers import SentenceTransformer

    from paperflow.core.lm.models import require_pinned

    info = json.loads(Path(dense_json).read_text())
    require_pinned(info["hub"], info["revision"])
    model = SentenceTransformer(info["folder"], device=str(device), local_files_only=True)
    model.max_seq_length = int(dense["max_seq_length"])
    if dense["dtype"] == "float16" and str(device).startswith("cuda"):
        model = model.half()
    return model


def encode(model, texts: Sequence[str], batch_size: int) -> np.ndarray:
    return model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False).astype(
        np.float16
    )


def index_corpus(
    model, texts: Sequence[str], batch_size: int, out: str | Path, chunk: int = 1 << 18, checkpoint=None
) -> tuple[int, int]:
    """Encode `texts` into `out` (float16 [n, dim] .npy, written chunk by chunk); returns its shape.

    `checkpoint` (the job's checkpoint folder; README, "Long jobs resume"): the array is written there instead and
    each chunk, once flushed, is a row of a `RowJournal`; a rerun with the same folder encodes only the chunks it
    lacks, and the finished array is then moved to `out`. None: written straight into `out` (as before)."""
    if checkpoint is None:
        first = encode(model, texts[:1], batch_size)
        arr = np.lib.format.open_memmap(str(out), mode="w+", dtype=np.float16, shape=(len(texts), first.shape[1]))
        for s in range(0, len(texts), chunk):
            arr[s : s + chunk] = encode(model, texts[s : s + chunk], batch_size)
        arr.flush()
        return arr.shape
    import shutil

    from paperflow.core.resume import RowJournal

    folder = Path(checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    part, done = folder / "index.npy", folder / "chunks.jsonl"
    if not part.exists():
        done.unlink(missing_ok=True)  # chunks journalled for an array that is gone (moved to `out`, or never made)
    if part.exists():
        arr = np.load(str(part), mmap_mode="r+")
    else:
        first = encode(model, texts[:1], batch_size)
        arr = np.lib.format.open_memmap(str(part), mode="w+", dtype=np.float16, shape=(len(texts), first.shape[1]))
    starts = list(range(0, len(texts), chunk))
    with RowJournal(done, key="start") as journal:
        for s in journal.todo(starts, key=lambda start: start):
            arr[s : s + chunk] = encode(model, texts[s : s + chunk], batch_size)
            arr.flush()
            journal.append({"start": s, "rows": len(texts[s : s + chunk])})
        journal.complete(starts)
    shape = arr.shape
    del arr
    shutil.move(str(part), str(out))
    return shape


def top(index_path: str | Path, queries: np.ndarray, k: int, device, chunk: int = 1 << 20) -> np.ndarray:
    """[n_queries, k] pids of the largest inner products with the corpus rows, best first (exact search over chunks
    of `chunk` passages; ties: the lower pid)."""
    import torch

    corpus = np.load(str(index_path), mmap_mode="r")
    k = min(int(k), corpus.shape[0])
    q = torch.as_tensor(np.asarray(queries, dtype=np.float32), device=device)
    best_s = torch.full((len(q), 0), float("-inf"), device=device)
    best_i = torch.zeros((len(q), 0), dtype=torch.long, device=device)
    for s in range(0, corpus.shape[0], chunk):
        block = torch.as_tensor(np.asarray(corpus[s : s + chunk], dtype=np.float32), device=device)
        scores = q @ block.T
        cand_s = torch.cat([best_s, scores], 1)
        cand_i = torch.cat([best_i, torch.arange(s, s + len(block), device=device).expand(len(q), -1)], 1)
        order = torch.sort(cand_s, dim=1, descending=True, stable=True).indices[:, :k]
        best_s, best_i = cand_s.gather(1, order), cand_i.gather(1, order)
    return best_i.cpu().numpy()


def gold_ranks(tops: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """1-based rank of gold[i] in tops[i] (tops.shape[1] + 1 when absent)."""
    hit = tops == np.asarray(gold)[:, None]
    return np.where(hit.any(1), hit.argmax(1) + 1, tops.shape[1] + 1)
