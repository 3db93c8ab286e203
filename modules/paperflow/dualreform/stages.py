"""DualReform's stages with their files, one function per rule (the scripts only pass paths and params)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.core.lm.models import checkpoint_spec, load_checkpoint, save_checkpoint
from paperflow.core.seeding import seed_all
from paperflow.dualreform import cqr, pipeline
from paperflow.dualreform.data import World
from paperflow.dualreform.retrieval import retrieval_metrics

log = logging.getLogger(__name__)


def _world(passages_path: str, turns_path: str) -> World:
    passages, meta = read_frame(passages_path)
    turns, _ = read_frame(turns_path)
    return World(passages, turns, meta["entities"], meta["aspect_values"])


def _lists(table: pd.DataFrame) -> pd.DataFrame:
    """Parquet returns list columns as arrays of arrays; make them Python lists again."""
    out = table.copy()
    for col in ("hist_queries", "qcands", "rcands", "q_gold_rank", "r_top1"):
        out[col] = [list(v) for v in out[col]]
    out["q_top"] = [[list(r) for r in v] for v in out["q_top"]]
    return out


def preprocess(
    passages: str,
    turns: str,
    bm25: Mapping[str, Any],
    teacher_seed: int,
    teacher_error_rate: float,
    tiebreak_seed: int,
    out: str,
):
    """The candidate table: each turn's rewrite and refinement candidates with their BM25 rankings, and the
    erring teacher's rewrites."""
    table = pipeline.candidate_table(
        _world(passages, turns), bm25["k1"], bm25["b"], tiebreak_seed, teacher_seed, teacher_error_rate
    )
    write_frame(out, table, {"bm25": dict(bm25), "templates": list(pipeline.TEMPLATES)})
    return table


def read_table(path: str) -> pd.DataFrame:
    return _lists(read_frame(path)[0])


def _spec(model: Mapping[str, Any], passages: pd.DataFrame) -> dict[str, Any]:
    return {**model, "vocab_size": len(cqr.make_tokenizer(pipeline.vocabulary(passages)))}


def train_sft(table: str, passages: str, model: Mapping[str, Any], sft: Mapping[str, Any], seed: int, output: str):
    """The CQR model's SFT stage for one seed: its checkpoint (`output`) and training history."""
    tab, (pas, _) = read_table(table), read_frame(passages)
    spec = _spec(model, pas)
    seed_all(seed)
    m, history = pipeline.train_sft(tab, pas, spec, sft, seed)
    save_checkpoint(m, output, spec)
    return history.assign(seed=seed, iteration=0)


def train_method(
    method: str,
    table: str,
    passages: str,
    sft_checkpoints: Mapping[int, str],
    settings: Mapping[str, Any],
    seeds: Sequence[int],
    outputs: Mapping[tuple[int, int], str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A preference method per seed from that seed's SFT model: checkpoints keyed (seed, iteration), the
    training history and the references of every iteration."""
    tab, (pas, _) = read_table(table), read_frame(passages)
    histories, refs = [], []
    for seed in seeds:
        seed_all(seed)
        sft_model = load_checkpoint(sft_checkpoints[seed])
        spec = checkpoint_spec(sft_checkpoints[seed])
        models, hist, ref = pipeline.train_method(method, sft_model, tab, pas, settings, seed)
        for it, m in models.items():
            save_checkpoint(m, outputs[(seed, it)], spec)
        histories.append(hist.assign(seed=seed))
        refs.append(ref.assign(seed=seed))
    return pd.concat(histories, ignore_index=True), pd.concat(refs, ignore_index=True)


def evaluate(
    method: str, table: str, passages: str, checkpoints: Mapping[tuple[int, int], str], seeds: Sequence[int]
) -> pd.DataFrame:
    """Test-turn retrieval of a method's checkpoints ((seed, iteration) -> file; none for `raw`, whose one result
    is listed under every seed): per seed and iteration, MRR, nDCG@3, R@10, R@100 and the share of each
    chosen template."""
    tab, (pas, _) = read_table(table), read_frame(passages)
    runs = {(s, 0): None for s in seeds} if method == "raw" else dict(checkpoints)
    rows = []
    for (seed, it), path in sorted(runs.items()):
        choices = pipeline.evaluate_choices(None if path is None else load_checkpoint(path), tab, pas)
        metrics = retrieval_metrics(choices["gold_rank"].to_numpy())
        shares = choices["template"].value_counts(normalize=True).reindex(range(len(pipeline.TEMPLATES)), fill_value=0)
        row = {"method": method, "seed": seed, "iteration": it, **metrics}
        row |= {f"share_{name}": float(shares[k]) for k, name in enumerate(pipeline.TEMPLATES)}
        rows.append(row)
    return pd.DataFrame(rows)
