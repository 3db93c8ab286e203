"""The weak base model (spec section 7, sft_base): a tiny Qwen2 trained on gold answers for a fixed, calibrated number
of steps so that its greedy test accuracy lands in 20-40%, leaving RL something to learn."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import sequence_logprobs
from paperflow.core.loop import run_loop
from paperflow.eapo.task import AdditionTask, accuracy


def model_spec(model: Mapping[str, Any], task: AdditionTask) -> dict[str, Any]:
    return {**model, "vocab_size": len(task.vocab)}


def train_base(task: AdditionTask, spec: Mapping[str, Any], sft: Mapping[str, Any], seed: int, exclude, test):
    """SFT on freshly drawn prompts with their gold answers (AdamW, token-mean NLL over the answer and EOS).
    Returns the model and its history (loss per step, greedy test accuracy every `eval_every` steps)."""
    torch.manual_seed(seed)
    model = build_model(spec, seed)
    model.train()
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=float(sft["lr"]), weight_decay=0.0)
    evals: dict[int, float] = {}

    def step(i: int):
        b = task.draw(int(sft["batch_size"]), rng, exclude).sft()
        logp = sequence_logprobs(model, b["input_ids"], b["attention_mask"])
        mask = b["completion_mask"].float()
        return -(logp * mask).sum() / mask.sum()

    def on_step(rec):
        if (rec["step"] + 1) % int(sft["eval_every"]) == 0:
            evals[rec["step"] + 1] = accuracy(model, task, test)

    rows = run_loop(step, opt, int(sft["steps"]), desc="sft base", on_step=on_step)
    for r in rows:
        r["step"] += 1
        if r["step"] in evals:
            r["test_accuracy"] = evals[r["step"]]
    model.eval()
    return model, rows
