"""DualReform's stages as plain functions: the turn table (preprocess), the SFT stage of the CQR model and
preference optimisation of each method (train), test-time reformulation with retrieval (evaluate).

The CQR model writes (paperflow.dualreform.writer): its preference candidates are K rewrites it samples for each
training query, its refinement of a response (the dual role) and its test-time rewrite are greedy generations. Every
training step is TRL's (SFTTrainer, DPOTrainer; paperflow.dualreform.lora.train_sft / train_dpo, the functions paper
scale calls), the tiny model fully fine-tuned.

Every trained method starts from the same SFT model of its seed, the CQR model fine-tuned on the synthetic
teacher's rewrites of the training queries and refinements of their responses (its two roles), which err at
`teacher_error_rate` (that model is also the SFT-only baseline, method id `sft_human` kept for the config's
continuity), as the paper's methods all start from one backbone. The candidates are sampled once per seed from that
SFT model and are the same for every method (spec section 9: candidates identical across methods):
- `raw`: the current query as is (no model);
- `sft_human`: the SFT model alone, rewriting greedily;
- `retpo`: reference-based preference optimisation, preferences from the gold passages (the upper bound);
- `dualreform`: preferences from pseudo references retrieved with responses the CQR model itself refines (greedy
  generation in the refine role): iteration 1 refines with the SFT model, iteration i with the model of iteration
  i - 1; each iteration optimises a fresh copy of the SFT model on its new preferences (the better model serves the
  refinement, spec section 2 step 6);
- `single_role`: pseudo references from responses refined by the erring teacher (no CQR model);
- `raw_ref`: a control, pseudo references retrieved with the unrefined responses (no refinement at all);
- `random_ref`: the negative control, pseudo references drawn at random from the corpus.

A round of preference optimisation scores each candidate by the rank of its reference passage in the
candidate's BM25 ranking (lower is better), fine-tunes on the best candidate, then runs DPO on (best, a random
strictly worse candidate) against a frozen copy of the fine-tuned model.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.lm.models import build_model
from paperflow.dualreform import cqr, lora, writer
from paperflow.dualreform.candidates import teacher_rewrite
from paperflow.dualreform.data import QUERY_WORDS, World
from paperflow.dualreform.retrieval import BM25Index

PREFERENCE_METHODS = ("retpo", "dualreform", "single_role", "raw_ref", "random_ref")
DEPTH = 100  # candidates' rankings are kept to this depth; a reference below it ranks DEPTH + 1
GENERATION_KEYS = ("k", "temperature", "top_k", "max_new_tokens")


def candidate_table(
    world: World, k1: float, b: float, tiebreak_seed: int, teacher_seed: int, teacher_error_rate: float
) -> pd.DataFrame:
    """One row per turn: the history's queries, the synthetic teacher's rewrite of the query and of the response
    (`teacher_rewrite`, `teacher_refine`; each erring with probability `teacher_error_rate`, the error in
    `teacher_rewrite_error`, `teacher_refine_error`), the top passage of the raw response (`r_raw_top1`) and of the
    teacher's refinement (`r_teacher_top1`), and the gold passage's rank under the raw query (`q_raw_gold_rank`).
    No candidate is written here: the CQR model samples them (train_method)."""
    index = BM25Index(world.passages["text"].tolist(), k1, b, tiebreak_seed)
    lexicon = {tuple(name.split()): name for name in world.entities}
    teacher_rng = np.random.default_rng([teacher_seed, 1])
    turns = world.turns.sort_values(["split", "conv", "turn"], kind="stable").reset_index(drop=True)
    rows = []
    hist_queries: list[str] = []
    hist: list[tuple[str, str]] = []
    last_conv = None
    for row in turns.itertuples():
        if row.conv != last_conv:
            last_conv, hist_queries, hist = row.conv, [], []
        tq, eq = teacher_rewrite(row.query, hist, lexicon, world.entities, teacher_error_rate, teacher_rng)
        tr, er = teacher_rewrite(
            row.response, [*hist, (row.query, "")], lexicon, world.entities, teacher_error_rate, teacher_rng
        )
        rows.append(
            {
                "hist_queries": list(hist_queries),
                "teacher_rewrite": tq,
                "teacher_rewrite_error": eq,
                "teacher_refine": tr,
                "teacher_refine_error": er,
            }
        )
        hist_queries.append(row.query)
        hist.append((row.query, row.response))
    table = pd.concat([turns, pd.DataFrame(rows)], axis=1)
    table["q_raw_gold_rank"] = index.rank_of(table["query"].tolist(), table["gold_pid"].to_numpy())
    table["r_raw_top1"] = index.top1(table["response"].tolist())
    table["r_teacher_top1"] = index.top1(table["teacher_refine"].tolist())
    return table


def expansion(text: str, rewrite: str) -> str:
    """What a rewrite of `text` adds to it: its words that `text` lacks, in order (the tiny model's target)."""
    have = set(text.split())
    return " ".join(w for w in rewrite.split() if w not in have)


def expand(text: str, added: str) -> str:
    """The rewrite the tiny model writes: `text` followed by the words it adds."""
    return " ".join(f"{text} {added}".split())


def reference_ranks(tops: Sequence[np.ndarray], refs: np.ndarray) -> list[np.ndarray]:
    """Per turn i, the 1-based rank of refs[i] in each of its candidates' rankings tops[i] [k_i, DEPTH]
    (DEPTH + 1 when not in it)."""
    out = []
    for top, ref in zip(tops, refs, strict=True):
        hit = np.asarray(top) == ref
        out.append(np.where(hit.any(-1), hit.argmax(-1) + 1, DEPTH + 1))
    return out


def preferences(ranks: Sequence[np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Best candidate per turn (lowest rank, ties broken at random; -1 for a turn without candidates) and a random
    strictly worse one (-1 where every candidate ties: no DPO pair from that turn)."""
    best = np.full(len(ranks), -1)
    worse = np.full(len(ranks), -1)
    for i, r in enumerate(ranks):
        r = np.asarray(r)
        noise = rng.random(r.size)
        if not r.size:
            continue
        best[i] = np.lexsort((noise, r))[0]
        options = np.flatnonzero(r > r[best[i]])
        if options.size:
            worse[i] = rng.choice(options)
    return best, worse


def pseudo_references(method: str, train: pd.DataFrame, n_passages: int, rng: np.random.Generator) -> np.ndarray:
    """The references of the single-round methods: gold (retpo), responses refined by the erring teacher
    (single_role), unrefined responses (raw_ref), random passages (random_ref)."""
    if method == "retpo":
        return train["gold_pid"].to_numpy()
    if method == "single_role":
        return train["r_teacher_top1"].to_numpy()
    if method == "raw_ref":
        return train["r_raw_top1"].to_numpy()
    if method == "random_ref":
        return rng.integers(0, n_passages, size=len(train))
    raise ConfigError(
        f"method {method!r} has no pseudo references; preference methods: {', '.join(PREFERENCE_METHODS)}"
    )


def vocabulary(passages: pd.DataFrame) -> list[str]:
    """Every word a prompt or a rewrite can hold: the corpus's words (entity names, aspects, values, filler)
    and the query words, sorted."""
    return sorted({w for text in passages["text"] for w in text.split()} | set(QUERY_WORDS))


def turn_prompts(table: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The rewrite-role and refine-role prompt texts of each turn (cqr.prompt_text)."""
    rewrite = [cqr.prompt_text(cqr.rewrite_prompt(h, q)) for h, q in zip(table["hist_queries"], table["query"])]
    refine = [
        cqr.prompt_text(cqr.refine_prompt(h, q, r))
        for h, q, r in zip(table["hist_queries"], table["query"], table["response"])
    ]
    return rewrite, refine


def trl_settings(stage: Mapping[str, Any], max_length: int, beta: float | None = None) -> dict[str, Any]:
    """A tiny-scale stage's settings (epochs, batch_size, lr[, beta]) as the TRL settings paper scale gives in full
    (paperflow.dualreform.settings.SFT_REQUIRED / DPO_REQUIRED): AdamW at a constant rate, no weight decay, no
    gradient clipping, float32, one step per batch."""
    out = {
        "learning_rate": float(stage["lr"]),
        "num_train_epochs": int(stage["epochs"]),
        "per_device_train_batch_size": int(stage["batch_size"]),
        "gradient_accumulation_steps": 1,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "max_length": int(max_length),
        "weight_decay": 0.0,
        "max_grad_norm": 0.0,
        "bf16": False,
    }
    if beta is not None:
        out |= {"beta": float(beta), "loss_type": "sigmoid"}
    return out


def _max_length(model) -> int:
    return int(model.config.max_position_embeddings)


def _quiet_datasets() -> None:
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()  # TRL maps each small dataset several times: one bar each would fill the job's log


def fit_sft(model, tok, prompts, targets, stage: Mapping[str, Any], seed: int, desc: str) -> pd.DataFrame:
    """TRL SFT of the tiny model (full fine-tuning, in place) through lora.train_sft; its history tagged `desc`."""
    _quiet_datasets()
    with tempfile.TemporaryDirectory(prefix="dualreform-sft-") as out_dir:
        _, _, history = lora.train_sft(
            model, tok, prompts, targets, None, trl_settings(stage, _max_length(model)), seed, out_dir, "cpu"
        )
    return history.assign(phase=desc)


def fit_dpo(model, tok, prompts, chosen, rejected, stage: Mapping[str, Any], seed: int, desc: str) -> pd.DataFrame:
    """TRL DPO of the tiny model (full fine-tuning against a frozen copy of itself, in place) through
    lora.train_dpo; its history tagged `desc`, TRL's rewards/accuracies as `reward_accuracy`."""
    _quiet_datasets()
    settings = trl_settings(stage, _max_length(model), beta=stage["beta"])
    with tempfile.TemporaryDirectory(prefix="dualreform-dpo-") as out_dir:
        _, _, history = lora.train_dpo(model, tok, prompts, chosen, rejected, None, settings, seed, out_dir, "cpu")
    return history.rename(columns={"rewards/accuracies": "reward_accuracy"}).assign(phase=desc)


def train_sft(table: pd.DataFrame, passages: pd.DataFrame, spec, settings: Mapping[str, Any], seed: int):
    """The CQR model's SFT stage on the synthetic teacher's (erring) outputs on the training turns, in both roles:
    its rewrites of the queries and its refinements of the responses. (model, history). No gold-derived text
    enters training."""
    train = table[table["split"] == "train"].reset_index(drop=True)
    tok = cqr.make_tokenizer(vocabulary(passages))
    model = build_model({**spec, "vocab_size": len(tok)}, seed=seed)
    rewrite, refine = turn_prompts(train)
    targets = [
        *(expansion(q, r) for q, r in zip(train["query"], train["teacher_rewrite"])),
        *(expansion(q, r) for q, r in zip(train["response"], train["teacher_refine"])),
    ]
    history = fit_sft(model, tok, [*rewrite, *refine], targets, settings, seed, "sft_teacher")
    return model, history


def check_generation(generation: Mapping[str, Any]) -> dict[str, Any]:
    """The generation settings (GENERATION_KEYS), refused by name when a key is missing or unknown."""
    from paperflow.core.config import reject_unknown, require_keys

    require_keys(generation, GENERATION_KEYS, "generation")
    reject_unknown(generation, GENERATION_KEYS, "generation")
    return dict(generation)


def sample_pool(model, tok, train: pd.DataFrame, index: BM25Index, generation: Mapping[str, Any], seed: int):
    """The candidates the model samples for each training query (rewrite role: the words it adds, possibly none)
    and the top-DEPTH BM25 ranking of each candidate rewrite (the query expanded by them): (candidate lists,
    ranking arrays [k_i, DEPTH])."""
    gen = check_generation(generation)
    rewrite, _ = turn_prompts(train)
    cands = writer.sample_candidates(
        model,
        tok,
        rewrite,
        k=int(gen["k"]),
        temperature=float(gen["temperature"]),
        top_k=gen["top_k"],
        max_new_tokens=int(gen["max_new_tokens"]),
        seed=seed,
        keep_empty=True,
    )
    flat = [expand(q, c) for q, cs in zip(train["query"], cands) for c in cs]
    top = index.rankings(flat, DEPTH) if flat else np.zeros((0, DEPTH), dtype=int)
    bounds = np.cumsum([0, *(len(cs) for cs in cands)])
    return cands, [top[bounds[i] : bounds[i + 1]] for i in range(len(cands))]


def optimise(model, refs, train, tok, cands, tops, settings: Mapping[str, Any], seed: int, tag: str):
    """One round of preference optimisation of `model` (in place) from `refs` over the sampled candidates: SFT on
    the best candidate of each turn with a preference, then DPO on (best, worse) pairs. A turn whose candidates all
    tie tells nothing about which is better (its "best" would be a random draw among equals): it gives neither.
    Returns the round's history."""
    rng = np.random.default_rng([seed, 1])
    best, worse = preferences(reference_ranks(tops, refs), rng)
    rewrite, _ = turn_prompts(train)
    pairs = [i for i in range(len(train)) if worse[i] >= 0]
    if not pairs:  # no preference at all: the round leaves the model as it is, and its history says so
        return pd.DataFrame({"phase": [f"{tag} no pairs"], "loss": [np.nan], "n_pairs": [0]})
    best_text = [cands[i][best[i]] for i in pairs]
    prompts = [rewrite[i] for i in pairs]
    history = [
        fit_sft(model, tok, prompts, best_text, settings["sft"], seed, f"{tag} sft"),
        fit_dpo(
            model, tok, prompts, best_text, [cands[i][worse[i]] for i in pairs], settings["dpo"], seed, f"{tag} dpo"
        ),
    ]
    return pd.concat(history, ignore_index=True).assign(n_pairs=len(pairs))


def _index(passages: pd.DataFrame, settings: Mapping[str, Any]) -> BM25Index:
    return BM25Index(
        passages["text"].tolist(), settings["bm25"]["k1"], settings["bm25"]["b"], settings["tiebreak_seed"]
    )


def train_method(
    method: str, sft_model, table: pd.DataFrame, passages: pd.DataFrame, settings: Mapping[str, Any], seed: int
) -> tuple[dict[int, Any], pd.DataFrame, pd.DataFrame]:
    """The models of a preference `method` for `seed` ({iteration: model}), started from a copy of the seed's SFT
    model; its training history; its references per iteration (train turns: ref, gold, and DualReform's refined
    response). `settings`: sft, dpo, iterations, generation, bm25, tiebreak_seed."""
    if method not in PREFERENCE_METHODS:
        raise ConfigError(
            f"train: method {method!r} is not a preference method; allowed values: {list(PREFERENCE_METHODS)}"
        )
    train = table[table["split"] == "train"].reset_index(drop=True)
    tok = cqr.make_tokenizer(vocabulary(passages))
    index = _index(passages, settings)
    gold = train["gold_pid"].to_numpy()
    cands, tops = sample_pool(sft_model, tok, train, index, settings["generation"], seed)
    _, refine = turn_prompts(train)
    n_iter = settings["iterations"] if method == "dualreform" else 1
    models, histories, ref_rows = {}, [], []
    refiner = sft_model
    for it in range(1, n_iter + 1):
        refined = [""] * len(train)
        if method == "dualreform":  # the dual role: the latest model writes the refined response
            added = writer.greedy(refiner, tok, refine, max_new_tokens=int(settings["generation"]["max_new_tokens"]))
            refined = [expand(r, a) for r, a in zip(train["response"], added)]
            refs = index.top1(refined)
        else:
            refs = pseudo_references(method, train, len(passages), np.random.default_rng([seed, 2]))
        ref_rows.append(
            pd.DataFrame(
                {"iteration": it, "turn_index": np.arange(len(train)), "ref": refs, "gold": gold, "refined": refined}
            )
        )
        model = copy.deepcopy(sft_model)
        history = optimise(model, refs, train, tok, cands, tops, settings, seed, tag=f"{method} it{it}")
        histories.append(history.assign(iteration=it))
        models[it] = refiner = model
    return models, pd.concat(histories, ignore_index=True), pd.concat(ref_rows, ignore_index=True)


def evaluate_choices(model, table: pd.DataFrame, passages: pd.DataFrame, settings: Mapping[str, Any]) -> pd.DataFrame:
    """Test turns: the model's greedy rewrite of the query and the gold passage's rank under it; `model=None` is
    the raw query. `settings`: generation, bm25, tiebreak_seed."""
    test = table[table["split"] == "test"].reset_index(drop=True)
    if model is None:
        rewrites = list(test["query"])
    else:
        tok = cqr.make_tokenizer(vocabulary(passages))
        rewrite, _ = turn_prompts(test)
        added = writer.greedy(model, tok, rewrite, max_new_tokens=int(settings["generation"]["max_new_tokens"]))
        rewrites = [expand(q, a) for q, a in zip(test["query"], added)]
    ranks = _index(passages, settings).rank_of(rewrites, test["gold_pid"].to_numpy())
    return pd.DataFrame({"conv": test["conv"], "turn": test["turn"], "rewrite": rewrites, "gold_rank": ranks})
