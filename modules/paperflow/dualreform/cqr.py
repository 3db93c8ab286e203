"""The tiny CQR model (spec section 7) in its two roles, on the language-model kit.

One causal LM rewrites the current utterance of a conversation into a self-contained one:
`<hist> q_1 ... q_{t-1} <cur> x <rew>` -> the rewrite of x. In the rewrite role x is the query q_t; in the
refine role (the dual role, spec section 11: "the CQR model's own rewrite ranking applied to" the response)
x is the response r_t and the history ends with q_t. The history holds the queries; the responses are left out
to keep sequences short at smoke scale (every entity a response names was named by a query first).

Inference ranks a turn's candidates by length-normalised log-probability under the model (spec section 7,
inference (a)); training is SFT on the best candidate, then DPO against the frozen SFT copy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from paperflow.core.config import reject_unknown, require_keys
from paperflow.core.lm.losses import dpo_loss
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.lm.tokenizer import encode_pairs, word_level_tokenizer
from paperflow.core.loop import run_loop

MARKERS = ("<hist>", "<cur>", "<rew>")
SFT_KEYS = ("epochs", "batch_size", "lr")
DPO_KEYS = ("epochs", "batch_size", "lr", "beta", "sft_weight")


def make_tokenizer(words: Sequence[str]):
    """The word-level tokenizer over the world's words and the prompt markers."""
    return word_level_tokenizer([*MARKERS, *words])


def rewrite_prompt(history_queries: Sequence[str], query: str) -> list[str]:
    return ["<hist>", *" ".join(history_queries).split(), "<cur>", *query.split(), "<rew>"]


def refine_prompt(history_queries: Sequence[str], query: str, response: str) -> list[str]:
    return rewrite_prompt([*history_queries, query], response)


def _batches(n: int, batch_size: int, rng: np.random.Generator | None) -> list[np.ndarray]:
    order = rng.permutation(n) if rng is not None else np.arange(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def completion_logprobs(model, tok, prompts, completions) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-prob of each completion (its EOS included) given its prompt, and its token count."""
    batch = encode_pairs(tok, prompts, completions)
    logp = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"])
    mask = batch["completion_mask"].to(logp.dtype)
    return (logp * mask).sum(-1), mask.sum(-1)


def _epoch_batches(n: int, settings: Mapping[str, Any], seed: int) -> list[np.ndarray]:
    """The index batches of `epochs` shuffled passes over n examples, drawn from the seed's generator."""
    rng = np.random.default_rng(seed)
    return [b for _ in range(settings["epochs"]) for b in _batches(n, settings["batch_size"], rng)]


def _fit(model, step, n_steps: int, lr: float, desc: str) -> list[dict]:
    """AdamW over `step(i)` on the core's plain loop (paperflow.core.loop.run_loop), model in train mode."""
    model.train()
    records = run_loop(step, torch.optim.AdamW(model.parameters(), lr=lr), n_steps, desc=desc)
    model.eval()
    return [{"phase": desc, **r} for r in records]


def sft(model, tok, prompts, targets, settings: Mapping[str, Any], seed: int, desc: str = "sft") -> list[dict]:
    """Supervised fine-tuning on (prompt, target) word lists: mean token NLL of the targets, AdamW."""
    require_keys(settings, SFT_KEYS, "sft")
    reject_unknown(settings, SFT_KEYS, "sft")
    batches = _epoch_batches(len(prompts), settings, seed)

    def step(i: int):
        idx = batches[i]
        total, count = completion_logprobs(model, tok, [prompts[j] for j in idx], [targets[j] for j in idx])
        return -total.sum() / count.sum()

    return _fit(model, step, len(batches), settings["lr"], desc)


@torch.no_grad()
def _reference_logprobs(ref, tok, prompts, completions, batch_size: int) -> torch.Tensor:
    out = [
        completion_logprobs(ref, tok, [prompts[i] for i in idx], [completions[i] for i in idx])[0]
        for idx in _batches(len(prompts), batch_size, None)
    ]
    return torch.cat(out) if out else torch.zeros(0)


def dpo(model, tok, prompts, chosen, rejected, settings: Mapping[str, Any], seed: int, desc: str = "dpo") -> list[dict]:
    """DPO (sigmoid loss, beta) of `model` against a frozen copy of itself taken now (the SFT model), with an
    optional SFT term on the chosen completions (`sft_weight`, spec section 9's guard against collapse)."""
    require_keys(settings, DPO_KEYS, "dpo")
    reject_unknown(settings, DPO_KEYS, "dpo")
    ref = copy.deepcopy(model).eval()
    ref_chosen = _reference_logprobs(ref, tok, prompts, chosen, 4 * settings["batch_size"])
    ref_rejected = _reference_logprobs(ref, tok, prompts, rejected, 4 * settings["batch_size"])
    batches = _epoch_batches(len(prompts), settings, seed)

    def step(i: int):
        idx = batches[i]
        n = len(idx)
        both, count = completion_logprobs(
            model, tok, [prompts[j] for j in idx] * 2, [chosen[j] for j in idx] + [rejected[j] for j in idx]
        )
        pc, pr = both[:n], both[n:]
        losses, rc, rr = dpo_loss(pc, pr, ref_chosen[idx], ref_rejected[idx], beta=settings["beta"])
        loss = losses.mean() - settings["sft_weight"] * pc.sum() / count[:n].sum()
        logs = {"reward_accuracy": (rc > rr).float().mean(), "chosen_logp": pc.mean(), "rejected_logp": pr.mean()}
        return loss, logs

    return _fit(model, step, len(batches), settings["lr"], desc)


@torch.no_grad()
def rank_candidates(model, tok, prompts, candidate_lists, batch_size: int = 256) -> np.ndarray:
    """The index of the best candidate (a string) of each prompt by length-normalised log-prob (ties: the first)."""
    flat_p = [p for p, cands in zip(prompts, candidate_lists) for _ in cands]
    flat_c = [c.split() for cands in candidate_lists for c in cands]
    scores = []
    for idx in _batches(len(flat_p), batch_size, None):
        total, count = completion_logprobs(model, tok, [flat_p[i] for i in idx], [flat_c[i] for i in idx])
        scores.append((total / count).numpy())
    flat = np.concatenate(scores)
    k = len(candidate_lists[0])
    if any(len(c) != k for c in candidate_lists):
        raise ValueError("every turn needs the same number of candidates")
    return flat.reshape(len(prompts), k).argmax(axis=1)
