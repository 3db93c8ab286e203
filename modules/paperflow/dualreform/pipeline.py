"""DualReform's stages as plain functions: the candidate table (preprocess), the SFT stage of the CQR model
and preference optimisation of each method (train), test-time reformulation with retrieval (evaluate).

Every trained method starts from the same SFT model of its seed, the CQR model fine-tuned on the synthetic
teacher's rewrites, which err at `teacher_error_rate` (that model is also the SFT-only baseline, method id
`sft_human` kept for the config's continuity), as the paper's methods all start from one backbone:
- `raw`: the current query as is (no model);
- `sft_human`: the SFT model alone, reranking the teacher's candidates;
- `retpo`: reference-based preference optimisation, preferences from the gold passages (the upper bound);
- `dualreform`: preferences from pseudo references retrieved with responses refined by the CQR model itself
  (its rewrite ranking applied to the response): iteration 1 refines with the SFT model, iteration i with the
  model of iteration i - 1; each iteration optimises a fresh copy of the SFT model on its new preferences (the
  better model serves the refinement, spec section 2 step 6);
- `single_role`: pseudo references from responses refined by the erring teacher (no CQR model);
- `raw_ref`: a control, pseudo references retrieved with the unrefined responses (no refinement at all);
- `random_ref`: the negative control, pseudo references drawn at random from the corpus.

A round of preference optimisation scores each candidate by the rank of its reference passage in the
candidate's BM25 ranking (lower is better), fine-tunes on the best candidate, then runs DPO on (best, a random
strictly worse candidate) against a frozen copy of the fine-tuned model.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.lm.models import build_model
from paperflow.dualreform import cqr
from paperflow.dualreform.candidates import TEMPLATES, candidates, teacher_rewrite
from paperflow.dualreform.data import QUERY_WORDS, World
from paperflow.dualreform.retrieval import BM25Index

PREFERENCE_METHODS = ("retpo", "dualreform", "single_role", "raw_ref", "random_ref")
DEPTH = 100  # candidates' rankings are kept to this depth; a reference below it ranks DEPTH + 1
UNREFINED = TEMPLATES.index("raw")  # the response as is


def candidate_table(
    world: World, k1: float, b: float, tiebreak_seed: int, teacher_seed: int, teacher_error_rate: float
) -> pd.DataFrame:
    """One row per turn: the history's queries, six rewrite candidates with the top-DEPTH ranking of each and
    the gold passage's rank, six refinement candidates of the response (the current query is part of its
    context) with the top passage of each, and the synthetic teacher's rewrite of the query and of the response
    (`teacher_rewrite`, `teacher_refine`; each erring with probability `teacher_error_rate`, the error in
    `teacher_rewrite_error`, `teacher_refine_error`) with the top passage of the latter (`r_teacher_top1`)."""
    index = BM25Index(world.passages["text"].tolist(), k1, b, tiebreak_seed)
    lexicon = {tuple(name.split()): name for name in world.entities}
    rng = np.random.default_rng(teacher_seed)
    teacher_rng = np.random.default_rng([teacher_seed, 1])
    turns = world.turns.sort_values(["split", "conv", "turn"], kind="stable").reset_index(drop=True)
    rows = []
    hist_queries: list[str] = []
    hist: list[tuple[str, str]] = []
    last_conv = None
    for row in turns.itertuples():
        if row.conv != last_conv:
            last_conv, hist_queries, hist = row.conv, [], []
        qc = candidates(row.query, hist, lexicon, world.aspect_values, rng)
        rc = candidates(row.response, [*hist, (row.query, "")], lexicon, world.aspect_values, rng)
        tq, eq = teacher_rewrite(row.query, hist, lexicon, world.entities, teacher_error_rate, teacher_rng)
        tr, er = teacher_rewrite(
            row.response, [*hist, (row.query, "")], lexicon, world.entities, teacher_error_rate, teacher_rng
        )
        rows.append(
            {
                "hist_queries": list(hist_queries),
                "qcands": qc,
                "rcands": rc,
                "teacher_rewrite": tq,
                "teacher_rewrite_error": eq,
                "teacher_refine": tr,
                "teacher_refine_error": er,
            }
        )
        hist_queries.append(row.query)
        hist.append((row.query, row.response))
    table = pd.concat([turns, pd.DataFrame(rows)], axis=1)
    flat_q = [c for cs in table["qcands"] for c in cs]
    top = index.rankings(flat_q, DEPTH).reshape(len(table), len(TEMPLATES), DEPTH)
    gold_rank = index.rank_of(flat_q, np.repeat(table["gold_pid"].to_numpy(), len(TEMPLATES)))
    table["q_top"] = [t.tolist() for t in top]
    table["q_gold_rank"] = gold_rank.reshape(len(table), len(TEMPLATES)).tolist()
    flat_r = [c for cs in table["rcands"] for c in cs]
    table["r_top1"] = index.top1(flat_r).reshape(len(table), len(TEMPLATES)).tolist()
    table["r_teacher_top1"] = index.top1(table["teacher_refine"].tolist())
    return table


def reference_ranks(q_top: np.ndarray, refs: np.ndarray) -> np.ndarray:
    """[n, k]: the 1-based rank of refs[i] in candidate k's ranking of turn i (DEPTH + 1 when not in it)."""
    hit = q_top == refs[:, None, None]
    return np.where(hit.any(-1), hit.argmax(-1) + 1, DEPTH + 1)


def preferences(ranks: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Best candidate per turn (lowest rank, ties broken at random) and a random strictly worse one
    (-1 where every candidate ties: no DPO pair from that turn)."""
    n, k = ranks.shape
    noise = rng.random((n, k))
    best = np.lexsort((noise, ranks), axis=-1)[:, 0]
    worse = np.full(n, -1)
    for i in range(n):
        options = np.flatnonzero(ranks[i] > ranks[i, best[i]])
        if options.size:
            worse[i] = rng.choice(options)
    return best, worse


def pseudo_references(method: str, train: pd.DataFrame, n_passages: int, rng: np.random.Generator) -> np.ndarray:
    """The references of the single-round methods: gold (retpo), responses refined by the erring teacher
    (single_role), unrefined responses (raw_ref), random passages (random_ref)."""
    r_top1 = np.stack(train["r_top1"].to_numpy())
    if method == "retpo":
        return train["gold_pid"].to_numpy()
    if method == "single_role":
        return train["r_teacher_top1"].to_numpy()
    if method == "raw_ref":
        return r_top1[:, UNREFINED]
    if method == "random_ref":
        return rng.integers(0, n_passages, size=len(train))
    raise ConfigError(
        f"method {method!r} has no pseudo references; preference methods: {', '.join(PREFERENCE_METHODS)}"
    )


def vocabulary(passages: pd.DataFrame) -> list[str]:
    """Every word a prompt or candidate can hold: the corpus's words (entity names, aspects, values, filler)
    and the query words, sorted."""
    return sorted({w for text in passages["text"] for w in text.split()} | set(QUERY_WORDS))


def _turn_prompts(table: pd.DataFrame) -> tuple[list[list[str]], list[list[str]]]:
    rewrite = [cqr.rewrite_prompt(h, q) for h, q in zip(table["hist_queries"], table["query"])]
    refine = [cqr.refine_prompt(h, q, r) for h, q, r in zip(table["hist_queries"], table["query"], table["response"])]
    return rewrite, refine


def _split_words(texts) -> list[list[str]]:
    return [t.split() for t in texts]


def train_sft(table: pd.DataFrame, passages: pd.DataFrame, spec, settings: Mapping[str, Any], seed: int):
    """The CQR model's SFT stage on the synthetic teacher's (erring) rewrites of the training turns' queries:
    (model, history). No gold-derived rewrite enters training."""
    train = table[table["split"] == "train"].reset_index(drop=True)
    tok = cqr.make_tokenizer(vocabulary(passages))
    model = build_model({**spec, "vocab_size": len(tok)}, seed=seed)
    rewrite, _ = _turn_prompts(train)
    history = cqr.sft(model, tok, rewrite, _split_words(train["teacher_rewrite"]), settings, seed, desc="sft_teacher")
    return model, pd.DataFrame(history)


def optimise(model, refs: np.ndarray, train: pd.DataFrame, tok, settings: Mapping[str, Any], seed: int, tag: str):
    """One round of preference optimisation of `model` (in place) from `refs`: SFT on the best candidates,
    then DPO on (best, worse) pairs. Returns the round's history and its preference counts."""
    rng = np.random.default_rng([seed, 1])
    best, worse = preferences(reference_ranks(np.stack(train["q_top"].to_numpy()), refs), rng)
    qc = list(train["qcands"])
    rewrite, _ = _turn_prompts(train)
    pairs = [i for i in range(len(train)) if worse[i] >= 0]
    history = cqr.sft(
        model, tok, rewrite, [qc[i][best[i]].split() for i in range(len(train))], settings["sft"], seed, f"{tag} sft"
    )
    history += cqr.dpo(
        model,
        tok,
        [rewrite[i] for i in pairs],
        [qc[i][best[i]].split() for i in pairs],
        [qc[i][worse[i]].split() for i in pairs],
        settings["dpo"],
        seed,
        f"{tag} dpo",
    )
    return pd.DataFrame(history).assign(n_pairs=len(pairs)), np.bincount(best, minlength=len(TEMPLATES))


def train_method(
    method: str, sft_model, table: pd.DataFrame, passages: pd.DataFrame, settings: Mapping[str, Any], seed: int
) -> tuple[dict[int, Any], pd.DataFrame, pd.DataFrame]:
    """The models of a preference `method` for `seed` ({iteration: model}), started from a copy of the seed's SFT
    model; its training history; its references per iteration (train turns: ref, gold)."""
    if method not in PREFERENCE_METHODS:
        raise ConfigError(
            f"train: method {method!r} is not a preference method; allowed values: {list(PREFERENCE_METHODS)}"
        )
    train = table[table["split"] == "train"].reset_index(drop=True)
    tok = cqr.make_tokenizer(vocabulary(passages))
    gold = train["gold_pid"].to_numpy()
    r_top1 = np.stack(train["r_top1"].to_numpy())
    n_iter = settings["iterations"] if method == "dualreform" else 1
    models, histories, ref_rows = {}, [], []
    refiner = sft_model
    for it in range(1, n_iter + 1):
        if method == "dualreform":  # the dual role: the latest model ranks the response's refinements
            _, refine = _turn_prompts(train)
            choice = cqr.rank_candidates(refiner, tok, refine, list(train["rcands"]))
            refs = r_top1[np.arange(len(train)), choice]
        else:
            refs = pseudo_references(method, train, len(passages), np.random.default_rng([seed, 2]))
        ref_rows.append(pd.DataFrame({"iteration": it, "turn_index": np.arange(len(train)), "ref": refs, "gold": gold}))
        model = copy.deepcopy(sft_model)
        history, _ = optimise(model, refs, train, tok, settings, seed, tag=f"{method} it{it}")
        histories.append(history.assign(iteration=it))
        models[it] = refiner = model
    return models, pd.concat(histories, ignore_index=True), pd.concat(ref_rows, ignore_index=True)


def evaluate_choices(model, table: pd.DataFrame, passages: pd.DataFrame) -> pd.DataFrame:
    """Test turns: the candidate the model ranks first (template index) and the gold passage's rank under it;
    `model=None` is the raw query."""
    test = table[table["split"] == "test"].reset_index(drop=True)
    if model is None:
        choice = np.zeros(len(test), dtype=int)
    else:
        tok = cqr.make_tokenizer(vocabulary(passages))
        rewrite, _ = _turn_prompts(test)
        choice = cqr.rank_candidates(model, tok, rewrite, list(test["qcands"]))
    ranks = np.stack(test["q_gold_rank"].to_numpy())[np.arange(len(test)), choice]
    return pd.DataFrame({"conv": test["conv"], "turn": test["turn"], "template": choice, "gold_rank": ranks})
