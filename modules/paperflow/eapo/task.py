"""EAPO's smoke task on the kit's digit world: 2-digit addition with a verifiable 3-digit answer (spec section 4).

Prompts are "<bos> a a + b b =" (7 tokens, all the same length, so no padding) and the answer is the sum's three
digits then EOS (4 tokens). Everything here works on id tensors: a batch of 128 rollouts is encoded, rewarded and
scored without a Python loop over rows. `reward_ids` equals `DigitWorld.reward` on every completion (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.digitworld import DigitWorld, Example
from paperflow.core.lm.sampling import sample
from paperflow.eapo.prepare import TASK

ANSWER_POSITIONS = ("hundreds", "tens", "units", "eos")  # the 4 answer tokens, in order


@dataclass
class Batch:
    """Encoded prompts and their gold answers: `prompt_ids` [B, P] (BOS first), `gold` [B, 4] (3 digits, EOS)."""

    prompt_ids: torch.Tensor
    gold: torch.Tensor

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.ones_like(self.prompt_ids)

    def repeat(self, group_size: int) -> Batch:
        """Each prompt `group_size` times in a row: rows [0, G) are prompt 0's (the kit's group layout)."""
        return Batch(self.prompt_ids.repeat_interleave(group_size, 0), self.gold.repeat_interleave(group_size, 0))

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]


class AdditionTask:
    """The world, its tokenizer and id-level helpers for one addition task."""

    def __init__(self, n_digits: int = 2):
        self.world = DigitWorld.from_config({TASK: {"n_digits": n_digits}})
        self.tokenizer = self.world.tokenizer()
        self.vocab = self.tokenizer.get_vocab()
        self.eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id
        self.bos = self.tokenizer.bos_token_id
        self.answer_length = n_digits + 2  # digits of the sum, then EOS

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> AdditionTask:
        return cls(int(cfg["n_digits"]))

    def encode(self, examples: Sequence[Example]) -> Batch:
        prompts = [[self.bos, *(self.vocab[w] for w in ex.prompt)] for ex in examples]
        gold = [[*(self.vocab[w] for w in ex.answer), self.eos] for ex in examples]
        return Batch(torch.tensor(prompts, dtype=torch.long), torch.tensor(gold, dtype=torch.long))

    def draw(self, n: int, rng: np.random.Generator, exclude: Sequence[Example]) -> Batch:
        return self.encode(self.world.sample(TASK, n, rng, exclude=exclude))

    def reward_ids(self, completion_ids: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """1.0 per row iff its first 4 completion tokens are the gold digits and EOS (what follows is ignored)."""
        n = gold.shape[1]
        got = completion_ids[:, :n]
        if got.shape[1] < n:  # every row ended early: pad so the comparison fails on the missing columns
            got = torch.cat([got, torch.full((got.shape[0], n - got.shape[1]), self.pad, dtype=got.dtype)], 1)
        return (got == gold).all(1).float()

    def sft_batch(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Prompt + gold answer as one sequence, with the completion mask over the answer (EOS included)."""
        ids = torch.cat([batch.prompt_ids, batch.gold], 1)
        mask = torch.zeros_like(ids)
        mask[:, batch.prompt_ids.shape[1] :] = 1
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": mask}


@torch.no_grad()
def accuracy(model, task: AdditionTask, batch: Batch, temperature: float = 0.0, seed: int = 0, samples: int = 1):
    """Mean reward over the batch: greedy (T = 0, `samples` 1) or the mean over `samples` draws per prompt at
    temperature T (avg@k with k = samples). No injection: the policy alone."""
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    ids = batch.prompt_ids.repeat(samples, 1)
    gold = batch.gold.repeat(samples, 1)
    rollout = sample(
        model,
        ids,
        torch.ones_like(ids),
        max_new_tokens=task.answer_length,
        temperature=temperature,
        generator=g,
        eos_token_id=task.eos,
        pad_token_id=task.pad,
    )
    model.train(was_training)
    return float(task.reward_ids(rollout.completion_ids, gold).mean())
