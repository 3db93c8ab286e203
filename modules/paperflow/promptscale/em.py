"""EM over rationales (spec sections 2.2, 2.3 and 7): cold start of q_phi and p_theta on the annotator's noisy
triples, then E iterations of

    E-step: z_1..z_K ~ q(. | c, x) at T = 1; R(z_k) = log p(x | z_k, c) + log p(z_k | c); keep z* = argmax_k R
            (`select: random` keeps a random one of the K: the section-11 negative control)
    fine-tune q on (c, x) -> z*; M-step: fine-tune p on c -> (z*, x)

and the held-out measures after every iteration: the importance-weighted bound
log (1/M) sum_m exp[log p(z_m, x | c) - log q(z_m | c, x)] with z_m ~ q (M = 8), and the recovery of the hidden
plan by the best-of-K z (alignment accuracy). `iwae` and the tabular EM below are what the tests check in
closed form.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.special import logsumexp

from paperflow.promptscale import models as pm
from paperflow.promptscale import world as w

log = logging.getLogger(__name__)
SELECT = ("best", "random")


def iwae(log_joint: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """Per item: log (1/M) sum_m exp(log p(z_m, x | c) - log q(z_m | c, x)); arrays [items, M]."""
    weights = np.asarray(log_joint, float) - np.asarray(log_q, float)
    return logsumexp(weights, axis=1) - np.log(weights.shape[1])


def choose(rewards: np.ndarray, select: str, rng: np.random.Generator) -> np.ndarray:
    """Index of the kept sample per item ([items, K] rewards): the argmax, or a uniform one for `random`."""
    if select == "best":
        return rewards.argmax(axis=1)
    if select == "random":
        return rng.integers(0, rewards.shape[1], rewards.shape[0])
    raise ValueError(f"select {select!r}: allowed {SELECT}")


def sample_rationales(
    q, tok, items: Sequence[tuple], k: int, max_plan: int, seed: int, score: bool = True
) -> tuple[list, np.ndarray | None]:
    """K rationales per (c, x) from q at T = 1, through the served model (item i with seed `seed + i`, as paper
    scale's E-step samples), then, with `score`, scored as paper scale scores them: (words [items*K] item-major,
    log q(z | c, x) [items, K] with the rationale's EOS, also for a sample cut at max_plan + 1 tokens; None without
    `score`: the E-step selects by R alone)."""
    prompts = [pm.q_pair(c, x, ())[0] for c, x in items]
    words, _ = pm.generate(q, tok, prompts, max_plan + 1, 1.0, seed, n=k)
    if not score:
        return words, None
    triples = [(c, x, z) for (c, x), i in zip(items, range(len(items))) for z in words[i * k : (i + 1) * k]]
    logq = pm.completion_logprob(q, tok, [pm.q_pair(c, x, z) for c, x, z in triples])
    return words, logq.reshape(len(items), k)


def score_joint(p, tok, items: Sequence[tuple], rationales: Sequence[tuple], k: int) -> np.ndarray:
    """R = log p(z, x | c) of each sampled rationale, [items, K]."""
    triples = [(c, z, x) for (c, x), i in zip(items, range(len(items))) for z in rationales[i * k : (i + 1) * k]]
    lz, lx = pm.p_scores(p, tok, triples)
    return (lz + lx).reshape(len(items), k)


def evaluate_heldout(
    q, p, tok, heldout: Sequence[w.Item], m: int, k: int, max_plan: int, seed: int
) -> dict[str, float]:
    """The held-out bound (M samples) and the best-of-K recovery of the true plan (K of the same samples)."""
    items = [(it.concepts, it.problem) for it in heldout]
    zs, logq = sample_rationales(q, tok, items, m, max_plan, seed)
    joint = score_joint(p, tok, items, zs, m)
    best = joint[:, :k].argmax(axis=1)
    recovery = [w.alignment_accuracy(zs[i * m + best[i]], it.plan) for i, it in enumerate(heldout)]
    wellformed = np.mean([w.parse_plan(z) is not None for z in zs])
    return {
        "iwae": float(iwae(joint, logq).mean()),
        "recovery": float(np.mean(recovery)),
        "log_q": float(logq.mean()),
        "log_joint": float(joint.mean()),
        "wellformed_rationales": float(wellformed),
    }


def run_em(
    q0,
    p0,
    tok,
    seeds: Sequence[tuple],
    heldout: Sequence[w.Item],
    settings: Mapping[str, Any],
    select: str,
    seed: int,
    progress_desc: str = "em",
    initial: Mapping[str, float] | None = None,
    every_iteration: bool = True,
    replicate: int = 0,
) -> tuple[Any, Any, list[dict[str, float]]]:
    """E iterations from copies of the cold-start models (`seeds`: (c, x) pairs). Returns the final q, p and one
    record per evaluated iteration (e = 0: the cold-start models themselves, `initial` when already measured;
    with `every_iteration` False only e = 0 and e = E are measured). `replicate` picks independent sampling and
    selection streams for the same seed (two random-of-K runs from one cold start)."""
    q, p = copy.deepcopy(q0), copy.deepcopy(p0)
    rng = np.random.default_rng([seed, 7, replicate])
    sampling = np.random.default_rng(np.random.SeedSequence([seed, replicate]))  # EM and random-of-K share it
    k, max_plan = int(settings["k"]), int(settings["max_plan"])
    ev = settings["evaluation"]
    if initial is None:
        initial = evaluate_heldout(q, p, tok, heldout, int(ev["m"]), k, max_plan, int(ev["seed"]))
    records = [{**initial, "iteration": 0}]
    last = int(settings["iterations"])
    for e in range(1, last + 1):
        zs, _ = sample_rationales(q, tok, seeds, k, max_plan, int(sampling.integers(2**31)), score=False)
        rewards = score_joint(p, tok, seeds, zs, k)
        keep = choose(rewards, select, rng)
        kept = [zs[i * k + j] for i, j in enumerate(keep)]
        pm.fit(
            q,
            tok,
            [pm.q_pair(c, x, z) for (c, x), z in zip(seeds, kept)],
            int(settings["steps"]),
            int(settings["batch_size"]),
            float(settings["lr"]),
            rng,
            f"{progress_desc} q e={e}",
        )
        pm.fit(
            p,
            tok,
            [pm.p_pair(c, z, x) for (c, x), z in zip(seeds, kept)],
            int(settings["steps"]),
            int(settings["batch_size"]),
            float(settings["lr"]),
            rng,
            f"{progress_desc} p e={e}",
        )
        if not (every_iteration or e == last):
            continue
        rec = evaluate_heldout(q, p, tok, heldout, int(ev["m"]), k, max_plan, int(ev["seed"]))
        rec.update(
            iteration=e,
            kept_reward=float(rewards[np.arange(len(keep)), keep].mean()),
            best_reward=float(rewards.max(axis=1).mean()),
            distinct_kept=len(set(kept)) / len(kept),
        )
        records.append(rec)
        log.info("%s e=%d: iwae %.3f recovery %.3f", progress_desc, e, rec["iwae"], rec["recovery"])
    return q, p, records


# --- tabular EM (spec section 10.1): the objective's closed forms on a discrete toy -------------------------


def tabular_joint(pz: np.ndarray, px: np.ndarray) -> np.ndarray:
    """p(z, x | c) = p(z | c) p(x | z, c) for tables pz [C, Z] and px [C, Z, X]: [C, Z, X]."""
    return pz[:, :, None] * px


def tabular_marginal(pz, px, data: Sequence[tuple[int, int]]) -> float:
    """sum_n log p(x_n | c_n)."""
    joint = tabular_joint(pz, px)
    return float(sum(np.log(joint[c, :, x].sum()) for c, x in data))


def tabular_hard_objective(pz, px, data) -> float:
    """J_hard = sum_n max_z log p(z, x_n | c_n)."""
    joint = tabular_joint(pz, px)
    return float(sum(np.log(joint[c, :, x].max()) for c, x in data))


def tabular_em_step(pz, px, data, hard: bool, smoothing: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """One EM step: the E-step's weights over z (exact posterior, or a one-hot argmax for hard EM), then the exact
    MLE M-step of both tables from the weighted counts (`smoothing` keeps unseen rows defined)."""
    joint = tabular_joint(pz, px)
    cz = np.full(pz.shape, smoothing)
    czx = np.full(px.shape, smoothing)
    for c, x in data:
        post = joint[c, :, x] / joint[c, :, x].sum()
        if hard:
            post = np.eye(len(post))[post.argmax()]
        cz[c] += post
        czx[c, :, x] += post
    return cz / cz.sum(1, keepdims=True), czx / czx.sum(2, keepdims=True)
