"""PromptScale's stages with their files, one function per rule (the scripts only pass paths and params).

download(source, world, out)                       the designer world's seeds, held-out and test items
preprocess(items, annotator, triples, vocab)       cold-start annotation: the true plans, corrupted
train_seed(...)                                    cold start of q and p, then EM per variant (em, randomk)
train_direct(...)                                  the no-rationale model p(x | c) (report only)
synthesize / evaluate(...)                         new problems from each model: validity, consistency, ...
run_solver(...)                                    seeds-only vs seeds + each variant's synthetic problems, self-play DPO
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.lm.models import load_checkpoint, save_checkpoint
from paperflow.core.seeding import seed_all
from paperflow.promptscale import em, solver
from paperflow.promptscale import models as pm
from paperflow.promptscale import world as w
from paperflow.promptscale.prepare import read_items, read_triples

log = logging.getLogger(__name__)


# EM variant -> (E-step selection, replicate stream): `randomk` is section 11's random-of-K E-step, on the same
# sampling stream as `em`; `randomk2` a second, independent random-of-K run (the controls of the EM-vs-random claims)
VARIANTS = {"em": ("best", 0), "randomk": ("random", 0), "randomk2": ("random", 1)}


def check_vocabulary(path: str, tok) -> None:
    vocab = tok.get_vocab()
    if json.loads(Path(path).read_text()) != sorted(vocab, key=vocab.get):  # the tokenizer's ids, in order
        raise ValueError(f"{path}: the tokenizer's vocabulary differs from it; rerun preprocess")


def cold_start(spec, tok, triples, settings: Mapping[str, Any], seed: int):
    """q_0 on (c, x) -> z~ and p_0 on c -> (z~, x), `settings.steps` each, from fresh models of this seed."""
    seed_all(seed)
    rng = np.random.default_rng([seed, 3])
    q = pm.new_model(spec, seed)
    p = pm.new_model(spec, seed + 1000)
    hq = pm.fit(
        q,
        tok,
        [pm.q_pair(c, x, z) for c, z, x in triples],
        int(settings["steps"]),
        int(settings["batch_size"]),
        float(settings["lr"]),
        rng,
        f"seed {seed} q0",
    )
    hp = pm.fit(
        p,
        tok,
        [pm.p_pair(c, z, x) for c, z, x in triples],
        int(settings["steps"]),
        int(settings["batch_size"]),
        float(settings["lr"]),
        rng,
        f"seed {seed} p0",
    )
    history = pd.concat([pd.DataFrame(hq).assign(model="q"), pd.DataFrame(hp).assign(model="p")], ignore_index=True)
    return q, p, history.assign(seed=seed)


def train_seed(
    items: str,
    triples: str,
    vocabulary: str,
    cfg: Mapping[str, Any],
    seed: int,
    variants: Sequence[str],
    out: Mapping[str, str],
) -> pd.DataFrame:
    """Cold start, then EM for every variant from the same cold-start models. Writes q_0 / p_0 and each variant's
    final q / p (safetensors with their spec), and returns the curves (variant, iteration, held-out measures)."""
    tok = pm.tokenizer()
    check_vocabulary(vocabulary, tok)
    spec = pm.model_spec(cfg["model"], tok)
    data = read_triples(triples)
    heldout = read_items(items, "heldout")
    q0, p0, history = cold_start(spec, tok, data, cfg["coldstart"], seed)
    save_checkpoint(q0, out["q0"], spec)
    save_checkpoint(p0, out["p0"], spec)
    history.to_csv(out["history"], index=False)
    seeds = [(c, x) for c, _, x in data]
    ev = cfg["em"]["evaluation"]
    initial = em.evaluate_heldout(
        q0, p0, tok, heldout, int(ev["m"]), int(cfg["em"]["k"]), int(cfg["em"]["max_plan"]), int(ev["seed"])
    )
    curves = []
    for variant in variants:
        select, replicate = VARIANTS[variant]
        q, p, records = em.run_em(
            q0,
            p0,
            tok,
            seeds,
            heldout,
            cfg["em"],
            select,
            seed,
            f"seed {seed} {variant}",
            initial,
            every_iteration=variant == "em",  # the controls' curves: their end points
            replicate=replicate,
        )
        save_checkpoint(q, out[f"{variant}_q"], spec)
        save_checkpoint(p, out[f"{variant}_p"], spec)
        curves.append(pd.DataFrame(records).assign(variant=variant, seed=seed))
    return pd.concat(curves, ignore_index=True)


def train_direct(
    items: str, triples: str, vocabulary: str, cfg: Mapping[str, Any], seed: int, out: str
) -> pd.DataFrame:
    """The no-rationale ablation: p(x | c) trained on the seeds for as many steps as p_theta gets in all."""
    tok = pm.tokenizer()
    check_vocabulary(vocabulary, tok)
    spec = pm.model_spec(cfg["model"], tok)
    seed_all(seed)
    model = pm.new_model(spec, seed + 2000)
    data = read_triples(triples)
    steps = int(cfg["coldstart"]["steps"]) + int(cfg["em"]["iterations"]) * int(cfg["em"]["steps"])
    rows = pm.fit(
        model,
        tok,
        [pm.direct_pair(c, x) for c, _, x in data],
        steps,
        int(cfg["coldstart"]["batch_size"]),
        float(cfg["coldstart"]["lr"]),
        np.random.default_rng([seed, 5]),
        "direct p(x|c)",
    )
    save_checkpoint(model, out, spec)
    return pd.DataFrame(rows).assign(seed=seed)


def concept_sets(items: str, synth: Mapping[str, Any], seed: int) -> list[tuple[str, ...]]:
    """The synthesis concept sets: the co-occurrence-plus-similarity sampler fitted on the seeds' concepts."""
    seeds = read_items(items, "seed")
    rng = np.random.default_rng([int(synth["seed"]), seed])
    sampler = w.ConceptSampler([it.concepts for it in seeds], rng, temperature=float(synth["sampler_temperature"]))
    return [sampler.draw(rng) for _ in range(int(synth["n"]))]


def synthesize(
    model_path: str, kind: str, concepts: Sequence[tuple], synth: Mapping[str, Any], seed: int
) -> pd.DataFrame:
    """New problems from a prompt model (`kind` rationale: (z, x) ~ p(. | c); direct: x ~ p(. | c)) at the synthesis
    temperature, with validity, concept consistency, op count and skeleton."""
    tok = pm.tokenizer()
    model = load_checkpoint(model_path)
    model.eval()
    prompts = [pm.p_pair(c, (), ())[0] if kind == "rationale" else pm.direct_pair(c, ())[0] for c in concepts]
    outs, ended = pm.generate(
        model, tok, prompts, int(synth["max_new_tokens"]), float(synth["temperature"]), int(synth["seed"]) * 1000 + seed
    )
    rows = []
    for c, out, done in zip(concepts, outs, ended):
        if kind == "rationale":
            plan, x = (
                (tuple(out[: out.index("<x>")]), tuple(out[out.index("<x>") + 1 :]))
                if "<x>" in out
                else (tuple(out), ())
            )
        else:
            plan, x = (), tuple(out)
        valid = bool(done) and w.is_valid(x)
        rows.append(
            {
                "concepts": " ".join(c),
                "plan": " ".join(plan),
                "problem": " ".join(x),
                "valid": valid,
                "consistent": valid and w.consistent(x, c),
                "ops": w.n_ops(x) if valid else np.nan,
                "skeleton": w.skeleton(x) if valid else "invalid",
            }
        )
    return pd.DataFrame(rows)


def distinct_2(problems: Sequence[str]) -> float:
    """Distinct bigrams over all tokens of the valid problems / all bigrams."""
    grams = [tuple(p.split()[i : i + 2]) for p in problems for i in range(len(p.split()) - 1)]
    return len(set(grams)) / max(len(grams), 1)


def synthesis_metrics(frame: pd.DataFrame) -> dict[str, float]:
    valid = frame[frame["valid"]]
    return {
        "validity": float(frame["valid"].mean()),
        "consistency": float(frame["consistent"].mean()),
        "mean_ops": float(valid["ops"].mean()) if len(valid) else float("nan"),
        "distinct_skeletons": float(valid["skeleton"].nunique() / max(len(valid), 1)),
        "distinct_2": distinct_2(list(valid["problem"])),
    }


def synthesised_problems(frame: pd.DataFrame, variant: str, seed: int) -> list[tuple[str, ...]]:
    """The valid problems one prompt model synthesised (the evaluate stage's table), in synthesis order."""
    rows = frame[(frame["variant"] == variant) & (frame["seed"] == seed) & frame["valid"]]
    return [tuple(x.split()) for x in rows["problem"]]


def run_solver(
    items: str, synthesised: str, vocabulary: str, cfg: Mapping[str, Any], seed: int, selfplay: bool
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Post-training a solver (spec section 7 claim 3): one fresh solver SFT'd on the seeds only, and one on the
    seeds + the valid problems synthesised by each prompt model of `solver.synthetic` (answers from the exact
    evaluator), with the same initialisation, steps and batch stream; with `selfplay`, self-play DPO from the
    seeds-only solver on EM's problems. Exact-match accuracy of each on the held-out items (the seeds' law) and on
    the harder test set."""
    tok = pm.tokenizer()
    check_vocabulary(vocabulary, tok)
    spec = pm.model_spec(cfg["model"], tok)
    seed_all(seed)
    seeds = [it.problem for it in read_items(items, "seed")]
    heldout, test = read_items(items, "heldout"), read_items(items, "test")
    frame, _ = read_frame(synthesised)
    s = cfg["solver"]

    def row(arm: str, model, train_problems: int) -> dict[str, Any]:
        return {
            "arm": arm,
            "heldout_accuracy": solver.accuracy(model, tok, heldout),
            "test_accuracy": solver.accuracy(model, tok, test),
            "train_problems": train_problems,
        }

    base = solver.train_solver(spec, tok, seeds, s, seed)
    rows = [row("seeds_only", base, len(seeds))]
    extra = {v: synthesised_problems(frame, v, seed) for v in s["synthetic"]}
    for v, problems in extra.items():
        rows.append(row(v, solver.train_solver(spec, tok, seeds + problems, s, seed), len(seeds) + len(problems)))
    dpo_rows = pd.DataFrame()
    if not selfplay:
        return pd.DataFrame(rows).assign(seed=seed), dpo_rows
    problems = synthesised_problems(frame, "em", seed)[: int(s["dpo_problems"])]
    pairs = solver.dpo_pairs(base, tok, problems, int(s["samples"]), float(s["temperature"]), seed)
    if pairs:
        policy, hist = solver.train_dpo(base, tok, pairs, s["dpo"], seed)
        rows.append(row("selfplay_dpo", policy, len(pairs)))
        dpo_rows = pd.DataFrame(hist)
    else:
        log.warning("no DPO pairs: the seeds-only solver is always right or always wrong on the synthetic problems")
        rows.append({"arm": "selfplay_dpo", "heldout_accuracy": np.nan, "test_accuracy": np.nan, "train_problems": 0})
    return pd.DataFrame(rows).assign(seed=seed), dpo_rows.assign(seed=seed)


KINDS = {"coldstart": "rationale", **{v: "rationale" for v in VARIANTS}, "norationale": "direct"}


def evaluate(
    items: str, models: Mapping[tuple[str, int], str], cfg: Mapping[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Synthesis from every prompt model (variant, seed) on the same concept sets per seed: (metrics per model,
    every synthesised problem)."""
    metrics, problems = [], []
    for (variant, seed), path in sorted(models.items()):
        frame = synthesize(path, KINDS[variant], concept_sets(items, cfg["synthesis"], seed), cfg["synthesis"], seed)
        metrics.append({"variant": variant, "seed": seed, **synthesis_metrics(frame)})
        problems.append(frame.assign(variant=variant, seed=seed))
    return pd.DataFrame(metrics), pd.concat(problems, ignore_index=True)
