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
    rng = np.random.default_rng(seed)
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
                permuted = outcome[torch.as_tensor(rng.permutation(len(outcome)))]
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
        adv, _, _ = rewards.advantages(streams, resp, s.group_size, baseline)
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
