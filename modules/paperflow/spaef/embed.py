"""The two language-model priors: spot sentences -> spot embeddings (OmiCLIP's text tower in the
paper, all-MiniLM-L6-v2 offline) and gene symbols -> gene embeddings (GenePT in the paper, MiniLM
of the gene's description offline), and the embed stage that writes them. Only the embed rule
imports this module, so only its env (envs/clip.yaml) needs open_clip."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame, write_frame
from paperflow.core.lm.encoders import encode_sentences
from paperflow.spaef.data import fetch_all
from paperflow.spaef.settings import embedding_downloads, known_keys

log = logging.getLogger(__name__)


def encode_omiclip(texts: Sequence[str], checkpoint: str | Path, batch_size: int, device: str) -> np.ndarray:
    """OmiCLIP (Loki) text tower: open_clip's coca_ViT-L-14 with the Loki checkpoint, L2-normalised
    text features (Loki's encode_text_df). open_clip (which needs torchvision) is in the embed rule's
    env, envs/clip.yaml, not in the local venv, and is imported on use."""
    try:
        import open_clip
    except ModuleNotFoundError as exc:
        raise ConfigError(
            "embedding.spot_model = 'omiclip' needs the open-clip-torch package (envs/clip.yaml, "
            "with --use-conda); use 'minilm' without it"
        ) from exc
    import torch

    model, _, _ = open_clip.create_model_and_transforms("coca_ViT-L-14", pretrained=str(checkpoint))
    tokenizer = open_clip.get_tokenizer("coca_ViT-L-14")
    model = model.to(device).eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            feats = model.encode_text(tokenizer(list(texts[start : start + batch_size])).to(device))
            out.append(torch.nn.functional.normalize(feats, dim=-1).cpu().numpy())
    return np.concatenate(out).astype(np.float32)


def genept_lookup(
    genes: Sequence[str],
    pickle_path: str | Path,
    member: str | None = None,
    *,
    sha256: str | None,
    root: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GenePT embeddings (dict symbol -> 1536-d vector), from a pickle file or the `member` of a zip (Zenodo's
    archive); returns (matrix, has-embedding mask); rows of genes without an embedding are zero and masked out of
    the gene graph (spec §9). Zenodo publishes only an md5, so the file is unpickled only once its sha256 is the
    config's `sha256` or the one the first pinned download recorded in config/locks/spaef.json
    (`paperflow.core.download.require_sha256`; WeakPinError otherwise)."""
    from paperflow.core.download import require_sha256

    require_sha256(pickle_path, slug="spaef", sha256=sha256, key="embedding.genept.embeddings.sha256", root=root)
    if member is None:
        with open(pickle_path, "rb") as fh:
            table = pickle.load(fh)
    else:
        import zipfile

        with zipfile.ZipFile(pickle_path) as archive, archive.open(member) as fh:
            table = pickle.load(fh)
    dim = len(next(iter(table.values())))
    mask = np.array([g in table for g in genes])
    emb = np.zeros((len(genes), dim), dtype=np.float32)
    for i, g in enumerate(genes):
        if g in table:
            emb[i] = np.asarray(table[g], dtype=np.float32)
    log.info("GenePT: %d of %d genes have an embedding", mask.sum(), len(genes))
    return emb, mask


# ---------------------------------------------------------------- the embed stage (§2.2.2, §2.3.1)


def gene_texts(adata: ad.AnnData) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Genes to embed (the matrix's, then the GGI training genes) and the GGI pairs by name (SynthSRT)."""
    ggi = adata.uns["ggi"]
    genes = pd.DataFrame(
        {
            "gene": [*adata.var_names, *ggi["genes"]],
            "text": [*adata.var["description"], *ggi["descriptions"]],
            "in_matrix": [True] * adata.n_vars + [False] * len(ggi["genes"]),
        }
    )
    names = np.asarray(ggi["genes"])
    pairs = pd.DataFrame(
        {"a": names[np.asarray(ggi["a"])], "b": names[np.asarray(ggi["b"])], "label": np.asarray(ggi["label"])}
    )
    return genes, pairs


def embed_stage(
    proc: str, sentences: str, cfg: Mapping[str, Any], cache: str, out_spots: str, out_genes: str, out_ggi: str
) -> dict[str, Any]:
    known_keys("embedding", cfg)
    adata = ad.read_h5ad(proc)
    sent, _ = read_frame(sentences)
    device = cfg["device"]
    downloads = embedding_downloads(cfg)
    if cfg["spot_model"] == "minilm":
        spots = encode_sentences(sent["sentence"].tolist(), cfg["batch_size"], device, cfg["sentence_tokens"])
    else:
        spots = encode_omiclip(
            sent["sentence"].tolist(),
            fetch_all("omiclip", downloads["omiclip"], cache)["file"],
            cfg["batch_size"],
            device,
        )
    if cfg["gene_model"] == "minilm":
        genes, pairs = gene_texts(adata)
        gene_emb = encode_sentences(genes["text"].tolist(), cfg["batch_size"], device)
        has = np.ones(len(genes), bool)
    else:
        files = fetch_all("genept", downloads["genept"], cache)
        pairs = read_ggi(files["ggi_text"], files["ggi_labels"])
        extra = sorted(set(pairs.a) | set(pairs.b) - set(adata.var_names))
        genes = pd.DataFrame(
            {"gene": [*adata.var_names, *extra], "in_matrix": [True] * adata.n_vars + [False] * len(extra)}
        )
        gene_emb, has = genept_lookup(
            genes["gene"].tolist(),
            files["embeddings"],
            cfg["genept"]["embeddings"].get("member"),
            sha256=cfg["genept"]["embeddings"]["sha256"],
        )
        pairs = pairs[pairs.a.isin(genes.gene[has]) & pairs.b.isin(genes.gene[has])]
    write_frame(
        out_spots,
        pd.DataFrame(spots, columns=[f"e{j}" for j in range(spots.shape[1])]).assign(spot=sent["spot"].to_numpy()),
        {"model": cfg["spot_model"]},
    )
    emb_cols = pd.DataFrame(gene_emb, columns=[f"e{j}" for j in range(gene_emb.shape[1])])
    write_frame(
        out_genes,
        pd.concat([genes[["gene", "in_matrix"]].assign(has_embedding=has), emb_cols], axis=1),
        {"model": cfg["gene_model"]},
    )
    write_frame(out_ggi, pairs.reset_index(drop=True))
    return {"spot_dim": int(spots.shape[1]), "gene_dim": int(gene_emb.shape[1]), "n_ggi_pairs": int(len(pairs))}


def read_ggi(text: Path, labels: Path) -> pd.DataFrame:
    """GenePT's GGI split: one 'GENE_A GENE_B' pair per line of train_text.txt, 0/1 per line of train_label.txt."""
    pairs = [line.split() for line in Path(text).read_text().splitlines() if line.strip()]
    lab = [int(float(v)) for v in Path(labels).read_text().split()]
    return pd.DataFrame({"a": [p[0] for p in pairs], "b": [p[1] for p in pairs], "label": lab})
