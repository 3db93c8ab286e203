"""Build one SynthSRT instance with the pipeline's own stage functions, outside the results tree:
raw -> proc.h5ad (+ sentences) -> MiniLM embeddings -> graphs (LM and no-LM) for one training seed.

Used for the development instance (a data seed that no claim uses) on which the smoke training
settings were chosen (dev_select.py), and by run.py when it is given a data seed instead of a results
folder. Usage:

    .venv/bin/python tools/sidebyside/spaef/instance.py --seed 100 --out /tmp/spaef_dev [--scale smoke]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import anndata as ad

from paperflow.core.config import load_paper_config
from paperflow.core.io import write_frame
from paperflow.spaef.data import download
from paperflow.spaef.embed import embed_stage
from paperflow.spaef.preprocess import preprocess
from paperflow.spaef.stages import graphs_stage


def build(seed: int, out: Path, scale: str = "smoke", cache: str = "resources/spaef") -> Path:
    """Files as the workflow lays them out: out/raw, out/data/<sample>, out/embeddings/<sample>,
    out/graphs/<sample>/seed<seed>.parquet, with sample = synth_s<seed>. Returns out."""
    cfg = load_paper_config("spaef", scale)
    name = cfg["claim_dataset"]
    sample = f"{name}_s{seed}"
    raw = out / "raw" / f"{sample}.h5ad"
    data, emb, graphs = (out / d / sample for d in ("data", "embeddings", "graphs"))
    for d in (raw.parent, data, emb, graphs):
        d.mkdir(parents=True, exist_ok=True)
    if not raw.exists():
        download(name, dict(cfg["datasets"][name]), seed, cache, raw)
    proc, sentences = data / "proc.h5ad", data / "sentences.parquet"
    if not proc.exists():
        p = cfg["preprocess"]
        adata, sent = preprocess(ad.read_h5ad(raw), p["gene_frac"], p["spot_frac"], p["sentence_length"])
        adata.write_h5ad(proc)
        write_frame(sentences, sent, {"sentence_length": p["sentence_length"]})
    spots, genes, ggi = emb / "spots.parquet", emb / "genes.parquet", emb / "ggi_pairs.parquet"
    if not spots.exists():
        embed_stage(str(proc), str(sentences), dict(cfg["embedding"]), cache, str(spots), str(genes), str(ggi))
    graph = graphs / f"seed{seed}.parquet"
    if not graph.exists():
        graphs_stage(
            str(proc),
            str(spots),
            str(genes),
            str(ggi),
            cfg["graphs"],
            [seed],
            [str(graph)],
            str(out / "logs"),
            None,
            {"paper": "spaef"},
            engine="loop",
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scale", default="smoke")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build(args.seed, args.out, args.scale)


if __name__ == "__main__":
    main()
