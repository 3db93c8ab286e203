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
    out["hist_queries"] = [list(v) for v in out["hist_queries"]]
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
    """The turn table: each turn's history, the erring teacher's rewrite and refinement, and the BM25 top passages
    of the raw response and of the teacher's refinement."""
    table = pipeline.candidate_table(
        _world(passages, turns), bm25["k1"], bm25["b"], tiebreak_seed, teacher_seed, teacher_error_rate
    )
    write_frame(out, table, {"bm25": dict(bm25)})
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
    method: str,
    table: str,
    passages: str,
    checkpoints: Mapping[tuple[int, int], str],
    seeds: Sequence[int],
    settings: Mapping[str, Any],
) -> pd.DataFrame:
    """Test-turn retrieval with a method's greedy rewrites ((seed, iteration) -> checkpoint; none for `raw`, whose
    one result is listed under every seed): per seed and iteration, MRR, nDCG@3, R@10, R@100, the mean rewrite
    length in words and the share of rewrites that keep the query unchanged. `settings`: generation, bm25,
    tiebreak_seed."""
    tab, (pas, _) = read_table(table), read_frame(passages)
    runs = {(s, 0): None for s in seeds} if method == "raw" else dict(checkpoints)
    rows = []
    for (seed, it), path in sorted(runs.items()):
        model = None if path is None else load_checkpoint(path)
        choices = pipeline.evaluate_choices(model, tab, pas, settings)
        metrics = retrieval_metrics(choices["gold_rank"].to_numpy())
        test = tab[tab["split"] == "test"].reset_index(drop=True)
        row = {"method": method, "seed": seed, "iteration": it, **metrics}
        row["rewrite_words"] = float(choices["rewrite"].str.split().str.len().mean())
        row["share_unchanged"] = float((choices["rewrite"] == test["query"]).mean())
        rows.append(row)
    return pd.DataFrame(rows)
