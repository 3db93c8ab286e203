"""The multi-turn RL loop (spec sections 2.2-2.4 and 7): rollouts of whole conversations with the seeded user, the
implicit PRM updated on the batch before it scores it, turn rewards by method, RLOO advantages over the streams,
and a PPO clipped update with a k3 KL to the reference. Two optimisers (policy and PRM), so `run_loop` runs in
manual mode.

Methods: `outcome` (outcome-only RLOO), `prime` (token-level PRIME rewards + RLOO), `itpo` (raw turn sums),
`itponorm` (outcome split by softmax turn weights), `itponorm_grpo` (GRPO's group normalisation, reconstructed).
The negative control of section 11 rides along the methods in `control_methods`: a second PRM, trained on the
same batches with the outcomes permuted within the batch, that never feeds the policy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.losses import clipped_surrogate, kl_estimate
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.loop import run_loop
from paperflow.itpo import env, prm, rewards


@dataclass
class Settings:
    steps: int
    prompts_per_step: int
    group_size: int
    lr: float
    prm_lr: float
    beta: float
    turn_temperature: float  # T of ITPO-norm's softmax
    rollout_temperature: float
    dpo_coef: float
    gt_coef: float
    clip: float
    kl_coef: float
    grad_clip: float
    prm_grad_clip: float
    prm_minibatches: int
    ppo_minibatches: int
    ppo_epochs: int
    eval_every: int
    control_methods: Sequence[str] = ("itponorm",)

    @classmethod
    def from_config(cls, rl: Mapping[str, Any]) -> Settings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in rl.items() if k in names})


def greedy_eval(policy, tasks: env.Tasks) -> dict[str, float]:
    """Spec section 8: greedy success on the fixed tasks (their user draws fixed), assistant tokens, turns."""
    ep = env.rollout(policy, tasks, 0.0, None)
    return {
        "greedy_success": float(ep.success.mean()),
        "greedy_tokens": float(ep.assistant_tokens.mean()),
        "greedy_turns": float(np.mean([len(t) for t in ep.turns])),
    }


TURN_KINDS = ("answer", "guess", "ask_b", "reask")


def turn_kind(turn: Mapping[str, Any]) -> str | None:
    """What a turn did, for the per-turn returns: `answer` (ANS with b known), `guess` (ANS with b unknown),
    `ask_b` (ASK_B on the first turn), `reask` (ASK_B after the user said DUNNO); None otherwise."""
    if turn["action"] == "ANS":
        return "answer" if turn["knows_b"] else "guess"
    if turn["action"] == "ASK_B" and not turn["knows_b"]:
        return "ask_b" if turn["turn"] == 0 else "reask"
    return None


def turn_values(
    values: torch.Tensor, resp: torch.Tensor, turns: Sequence[Sequence[Mapping]], name: str
) -> dict[str, float]:
    """`values` [N, L] (returns or advantages) at the first token of each turn, averaged by what the turn did
    (`turn_kind`; the README's measurement of why ITPO-norm and outcome-only differ): `<name>_<kind>`, NaN where
    the batch has no turn of that kind."""
    ids = rewards.turn_ids(resp)
    first = (ids > 0) & (torch.nn.functional.pad(ids, (1, 0))[:, :-1] != ids)
    out: dict[str, list[float]] = {kind: [] for kind in TURN_KINDS}
    for i, row in enumerate(turns):
        for turn, v in zip([t for t in row if t["tokens"] > 0], values[i][first[i]].tolist()):
            kind = turn_kind(turn)
            if kind is not None:
                out[kind].append(v)
    return {f"{name}_{k}": float(np.mean(v)) if v else float("nan") for k, v in out.items()}


@dataclass
class Trained:
    policy: Any
    prm: Any
    control_prm: Any
    records: list[dict[str, float]]


def train(init, method: str, s: Settings, seed: int, eval_tasks: env.Tasks) -> Trained:
    """`method` from the initial policy `init` (not modified) for `s.steps` iterations with `seed`."""
    if method not in rewards.METHODS:
        raise ValueError(f"method {method!r} is not one of {rewards.METHODS}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)  # the task stream: the same for every arm of a seed
    # the control's outcome permutations draw from a generator of their own, so the control never moves the task
    # stream of the arm it rides on (issue 45)
    perm_rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1,)))
    gen = torch.Generator().manual_seed(seed)
    policy, ref = copy.deepcopy(init).train(), copy.deepcopy(init).eval()
    implicit, control = copy.deepcopy(init).train(), copy.deepcopy(init).train()
    for p in ref.parameters():
        p.requires_grad_(False)
    uses_prm = method in rewards.PRM_METHODS
    with_control = uses_prm and method in s.control_methods
    opt = torch.optim.AdamW(policy.parameters(), lr=s.lr, weight_decay=0.0)
    prm_opt = torch.optim.AdamW(implicit.parameters(), lr=s.prm_lr, weight_decay=0.0)
    control_opt = torch.optim.AdamW(control.parameters(), lr=s.prm_lr, weight_decay=0.0)
    baseline = "grpo" if method.endswith("_grpo") else "rloo"
    evals = {0: greedy_eval(policy, eval_tasks)}

    def step(i: int):
        tasks = env.draw_tasks(s.prompts_per_step, rng, eval_tasks.goal).repeat(s.group_size, rng)
        ep = env.rollout(policy, tasks, s.rollout_temperature, gen)
        ids, attn, resp = ep.input_ids, ep.attention_mask, ep.response_mask
        with torch.no_grad():
            old = sequence_logprobs(policy, ids, attn)
            ref_logp = sequence_logprobs(ref, ids, attn)
        outcome = torch.as_tensor(ep.success, dtype=torch.float32)
        length = torch.as_tensor(ep.length_cost, dtype=torch.float32)
        logs: dict[str, float] = {}
        scores = None
        if uses_prm:
            args = (ref_logp, ids, attn, resp)
            logs["prm_loss"] = prm.update_prm(
                implicit, prm_opt, *args, outcome, s.beta, s.prm_minibatches, s.prm_grad_clip
            )
            if with_control:
                permuted = outcome[torch.as_tensor(perm_rng.permutation(len(outcome)))]
                logs["control_prm_loss"] = prm.update_prm(
                    control, control_opt, *args, permuted, s.beta, s.prm_minibatches, s.prm_grad_clip
                )
            scores = rewards.batch_norm_scores(prm.token_rewards(implicit, *args, s.beta), resp)
            logs["proportion_variance"] = rewards.proportion_variance(scores, resp, s.turn_temperature)
        streams = rewards.reward_streams(
            method,
            resp,
            outcome,
            length,
            scores,
            temperature=s.turn_temperature,
            dpo_coef=s.dpo_coef,
            gt_coef=s.gt_coef,
        )
        adv, returns, _ = rewards.advantages(streams, resp, s.group_size, baseline)
        losses = []
        for _ in range(s.ppo_epochs):
            for rows in torch.randperm(len(ids), generator=gen).chunk(s.ppo_minibatches):
                logp = sequence_logprobs(policy, ids[rows], attn[rows])
                loss, _ = clipped_surrogate(
                    logp,
                    old[rows],
                    adv[rows],
                    resp[rows],
                    s.clip,
                    s.clip,
                    "token_mean",
                    kl=kl_estimate(logp, ref_logp[rows], "k3"),
                    kl_coef=s.kl_coef,
                )
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), s.grad_clip)
                opt.step()
                losses.append(float(loss.detach()))
        logs.update(
            success=float(ep.success.mean()),
            assistant_tokens=float(ep.assistant_tokens.mean()),
            turns=float(np.mean([len(t) for t in ep.turns])),
            adv_volatility=rewards.advantage_volatility(adv, resp),
            **turn_values(returns, resp, ep.turns, "return"),
            **turn_values(adv, resp, ep.turns, "adv"),
        )
        return sum(losses) / len(losses), logs

    def on_step(rec):
        done = rec["step"] + 1
        if done % s.eval_every == 0 or done == s.steps:
            evals[done] = greedy_eval(policy, eval_tasks)

    rows = run_loop(step, None, s.steps, desc=f"{method} seed {seed}", on_step=on_step)
    records = [{"step": 0, **evals[0]}]
    for r in rows:
        r["step"] += 1
        records.append({**r, **evals.get(r["step"], {})})
    return Trained(policy.eval(), implicit.eval(), control.eval(), records)
