"""Post-training a solver on the synthesised problems (spec sections 2.5 and 7, report only at smoke scale):
SFT on seeds only vs seeds + synthetic problems (answers from the exact evaluator, the "teacher"), and self-play
DPO from the seeds-only solver: 8 answers per synthetic problem at T = 1.2, verified by evaluation, pairs of a
correct and a wrong answer, the kit's DPO loss (equal to TRL's) against the frozen seeds-only solver."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.losses import dpo_loss
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.loop import run_loop
from paperflow.promptscale import models as pm
from paperflow.promptscale import world as w

ANSWER_TOKENS = 7  # sign and up to 5 digits, and EOS


def train_solver(spec, tok, problems: Sequence[tuple], settings: Mapping[str, Any], seed: int):
    """SFT of a fresh solver on (x, eval(x)) for `settings.steps` steps."""
    model = pm.new_model(spec, seed)
    pm.fit(
        model,
        tok,
        [pm.solver_pair(x, w.evaluate(x)) for x in problems],
        int(settings["steps"]),
        int(settings["batch_size"]),
        float(settings["lr"]),
        np.random.default_rng([seed, 11]),
        "solver sft",
    )
    return model


def accuracy(model, tok, problems: Sequence[w.Item]) -> float:
    """Greedy exact-match accuracy of the answer."""
    outs = pm.greedy(model, tok, [it.problem for it in problems], ANSWER_TOKENS)
    return float(np.mean([o == pm.answer_words(it.answer) for o, it in zip(outs, problems)]))


def dpo_pairs(model, tok, problems: Sequence[tuple], samples: int, temperature: float, seed: int):
    """(x, chosen answer, rejected answer) per problem where the samples hold both a correct and a wrong answer."""
    outs, _ = pm.generate(model, tok, list(problems), ANSWER_TOKENS, temperature, seed, n=samples)
    pairs = []
    for i, x in enumerate(problems):
        gold = pm.answer_words(w.evaluate(x))
        group = outs[i * samples : (i + 1) * samples]
        right = [o for o in group if o == gold]
        wrong = [o for o in group if o != gold and o]
        if right and wrong:
            pairs.append((x, right[0], wrong[0]))
    return pairs


def train_dpo(model, tok, pairs, settings: Mapping[str, Any], seed: int):
    """Offline DPO (sigmoid loss, beta) from `model` against its frozen copy, summed sequence log-probs."""
    policy, ref = copy.deepcopy(model), copy.deepcopy(model)
    ref.eval()
    chosen = pm.Encoded.of(tok, [(x, c) for x, c, _ in pairs])
    rejected = pm.Encoded.of(tok, [(x, r) for x, _, r in pairs])

    def seq_logp(m, enc, idx, grad):
        b = enc.batch(idx)
        with torch.set_grad_enabled(grad):
            lp = sequence_logprobs(m, b["input_ids"], b["attention_mask"])
        return (lp * b["completion_mask"]).sum(1)

    rng = np.random.default_rng([seed, 13])
    opt = torch.optim.AdamW(policy.parameters(), lr=float(settings["lr"]), weight_decay=0.0)
    policy.train()

    def step(i):
        idx = torch.as_tensor(rng.integers(0, len(pairs), int(settings["batch_size"])))
        losses, rc, rr = dpo_loss(
            seq_logp(policy, chosen, idx, True),
            seq_logp(policy, rejected, idx, True),
            seq_logp(ref, chosen, idx, False),
            seq_logp(ref, rejected, idx, False),
            beta=float(settings["beta"]),
        )
        return losses.mean(), {"margin": (rc - rr).mean()}

    rows = run_loop(step, opt, int(settings["steps"]), desc="solver dpo")
    policy.eval()
    return policy, rows
