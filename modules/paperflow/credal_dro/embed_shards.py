"""The paper-scale text embedding in shards that a killed job resumes from (README, "Long jobs resume").

    vectors = encode_in_shards(texts, batch_size=512, device="cuda", folder=job.checkpoint_dir())

The distinct texts, sorted (the order `paperflow.core.lm.encoders.encode_sentences` encodes in), are cut into
shards of `shard_texts`; each shard is encoded by one `encode_sentences` call and saved as `shard_<k>.npy` in
`folder`, and a `RowJournal` (`shards.jsonl`, the small index) records it once its file is written and synced. A
rerun loads the shards the index names and encodes only the others; the shards do not depend on which run made
them, so a resumed job writes what an uninterrupted one writes. `folder` None (a call outside a job) keeps the
shards in a scratch folder for the call only. The smoke and cpu scales keep the one-pass `encode_sentences`
(workflows/credal_dro/scripts/embed.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from paperflow.core.resume import RowJournal

SHARD_TEXTS = 32768  # texts per shard: seconds to a few minutes of MiniLM on a GPU, well inside 30 min
INDEX = "shards.jsonl"


def _digest(texts: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(texts)).encode()).hexdigest()


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, array, allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _encode(texts: Sequence[str], batch_size: int, device: str, progress: bool) -> np.ndarray:
    from paperflow.core.lm.encoders import encode_sentences

    return encode_sentences(texts, batch_size, device, progress=progress)


def encode_in_shards(
    texts: Sequence[str],
    batch_size: int,
    device: str = "cpu",
    folder: str | Path | None = None,
    shard_texts: int = SHARD_TEXTS,
    progress: bool = False,
    encode: Callable[..., np.ndarray] = _encode,
) -> np.ndarray:
    """MiniLM embeddings of `texts` (float32, one row per text, in order), encoded shard by shard with each
    finished shard kept in `folder` (module docstring). `encode(texts, batch_size, device, progress)` overrides
    the encoder (tests)."""
    if shard_texts < 1:
        raise ValueError(f"shard_texts must be >= 1, got {shard_texts}")
    texts = [str(t) for t in texts]
    distinct = sorted(set(texts))
    if folder is None:
        with tempfile.TemporaryDirectory() as scratch:
            return encode_in_shards(texts, batch_size, device, scratch, shard_texts, progress, encode)
    folder = Path(folder)
    shards = [distinct[i : i + shard_texts] for i in range(0, len(distinct), shard_texts)]
    parts = []
    with RowJournal(folder / INDEX, key="shard") as index:
        for k, shard in enumerate(shards):
            path, digest = folder / f"shard_{k:05d}.npy", _digest(shard)
            if k in index:
                row = index.complete([k])[0]
                if row["texts"] != digest or row["n"] != len(shard):
                    raise ValueError(f"{folder}: shard {k} was made of other texts; remove the folder to start afresh")
                vectors = np.load(path, allow_pickle=False)
            else:
                vectors = np.asarray(encode(shard, batch_size, device, progress), dtype=np.float32)
                if vectors.shape[0] != len(shard):
                    raise ValueError(f"the encoder gave {vectors.shape[0]} vectors for {len(shard)} texts")
                _save(path, vectors)
                index.append({"shard": k, "n": len(shard), "texts": digest, "file": path.name})
            parts.append(vectors)
    if not texts:
        from paperflow.core.lm.encoders import MINILM_DIM

        return np.zeros((0, MINILM_DIM), dtype=np.float32)
    row_of = {t: i for i, t in enumerate(distinct)}
    return np.concatenate(parts)[[row_of[t] for t in texts]]
