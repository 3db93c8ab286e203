"""EAPO's smoke task on the kit's digit world: 2-digit addition with a verifiable 3-digit answer (spec section 4).

Prompts are "<bos> a a + b b =" (7 tokens, all the same length, so no padding) and the answer is the sum's three
digits then EOS (4 tokens). Batches are the kit's `EncodedBatch` (id tensors), rewarded without a Python loop over
rows (`EncodedBatch.rewards` equals `DigitWorld.reward`, tested in the kit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.digitworld import DigitWorld, EncodedBatch, Example
from paperflow.core.lm.sampling import sample
from paperflow.eapo.prepare import TASK

ANSWER_POSITIONS = ("hundreds", "tens", "units", "eos")  # the 4 answer tokens, in order
Batch = EncodedBatch


class AdditionTask:
    """The world, its tokenizer and the id-level helpers of one addition task."""

    def __init__(self, n_digits: int = 2):
        self.world = DigitWorld.from_config({TASK: {"n_digits": n_digits}})
        self.tokenizer = self.world.tokenizer()
        self.vocab = self.tokenizer.get_vocab()
        self.eos = self.tokenizer.eos_token_id
        self.pad = self.tokenizer.pad_token_id
        self.answer_length = n_digits + 2  # digits of the sum, then EOS

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> AdditionTask:
        return cls(int(cfg["n_digits"]))

    def encode(self, examples: Sequence[Example]) -> EncodedBatch:
        return self.world.encode(self.tokenizer, examples)

    def draw(self, n: int, rng: np.random.Generator, exclude: Sequence[Example]) -> EncodedBatch:
        return self.encode(self.world.sample(TASK, n, rng, exclude=exclude))

    def reward_ids(self, batch: EncodedBatch, completion_ids: torch.Tensor) -> torch.Tensor:
        """The verifiable reward of each row of `batch` for its sampled completion (1 iff exact answer + EOS)."""
        return batch.rewards(completion_ids)


@torch.no_grad()
def accuracy(model, task: AdditionTask, batch: EncodedBatch, temperature: float = 0.0, seed: int = 0, samples: int = 1):
    """Mean reward over the batch: greedy (T = 0, `samples` 1) or the mean over `samples` draws per prompt at
    temperature T (avg@k with k = samples). No injection: the policy alone."""
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    rows = batch.tile(samples)
    rollout = sample(
        model,
        rows.prompt_ids,
        rows.prompt_mask,
        max_new_tokens=task.answer_length,
        temperature=temperature,
        generator=g,
        eos_token_id=task.eos,
        pad_token_id=task.pad,
    )
    model.train(was_training)
    return float(task.reward_ids(rows, rollout.completion_ids).double().mean())  # float64: 300/500 is 0.6, not above
