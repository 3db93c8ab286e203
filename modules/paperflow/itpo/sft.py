"""sft_init (spec section 7): the initial policy, a tiny Llama trained by token-mean NLL on the assistant tokens of
synthetic demonstrations (`env.demo`). It can add (it answers correctly once it knows a and b) but asks at random,
so its initial success is about 25%."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.loop import run_loop
from paperflow.itpo import env


def model_spec(model: Mapping[str, Any]) -> dict[str, Any]:
    """The config's model block with the environment's vocabulary size (the config may set a larger one)."""
    size = len(env.tokenizer().get_vocab())
    return {**model, "vocab_size": max(int(model.get("vocab_size", size)), size)}


def demo_batch(n: int, practice: int, goal: str, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """`n` demonstrations and `practice` addition drills (`env.demo`), left-padded, the assistant mask aligned."""
    vocab = env.ids()
    demos = [env.demo(rng, goal) for _ in range(n)] + [env.demo(rng, goal, practice=True) for _ in range(practice)]
    n = len(demos)
    width = max(len(w) for w, _ in demos)
    ids = torch.full((n, width), env.tokenizer().pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    resp = torch.zeros((n, width), dtype=torch.long)
    for i, (words, mask) in enumerate(demos):
        ids[i, width - len(words) :] = torch.tensor([vocab[w] for w in words])
        attn[i, width - len(words) :] = 1
        resp[i, width - len(words) :] = torch.tensor(mask)
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp}


def train_init(spec: Mapping[str, Any], sft: Mapping[str, Any], eval_tasks: env.Tasks):
    """SFT for `steps` AdamW steps on fresh demos; returns the model and its history (loss per step, greedy
    success on `eval_tasks` at the end)."""
    seed = int(sft["seed"])
    torch.manual_seed(seed)
    model = build_model(spec, seed)
    model.train()
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=float(sft["lr"]), weight_decay=0.0)

    def step(i: int):
        b = demo_batch(int(sft["batch_size"]), int(sft["practice"]), eval_tasks.goal, rng)
        logp = sequence_logprobs(model, b["input_ids"], b["attention_mask"])
        mask = b["response_mask"].float()
        return -(logp * mask).sum() / mask.sum()

    rows = run_loop(step, opt, int(sft["steps"]), desc="sft init")
    model.eval()
    episodes = env.rollout(model, eval_tasks, 0.0, None)
    rows[-1]["greedy_success"] = float(episodes.success.mean())
    return model, rows
