"""The CQR model writes (spec section 2 steps 1, 2 and 7), one module for every scale: the tiny word-level model of
smoke and cpu, and the pretrained instruct model of paper scale.

- `sample_candidates`: K sampled rewrites per prompt (temperature, optional top-k), de-duplicated in the order they
  were drawn, empty ones dropped. Prompt i draws from its own generator seeded by (seed, i), through the kit's
  sampler (`paperflow.core.lm.sampling.sample` with `RowStreams`), so a prompt's candidates do not depend on the batch
  it was decoded in. The rewrite role (query -> rewrite) gives the preference candidates; the refine role
  (response -> refined response) is the dual role.
- `greedy`: one greedy rewrite per prompt (test-time rewriting, and the dual role's refinement).

Prompts are strings tokenized as TRL tokenizes them (`tokenizer(text)`): the tiny model's prompts carry their own
"<bos>"; a pretrained model's are its chat template's text (paperflow.dualreform.lora.prompt_text).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from paperflow.core.lm.sampling import RowStreams, sample


def turn_seed(seed: int, index: int) -> int:
    """The generator seed of prompt `index` under run seed `seed`."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def _left_padded(tokenizer, prompts: Sequence[str], repeat: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer(p)["input_ids"] for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows) * repeat, width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows) * repeat, width), dtype=torch.long)
    for i, r in enumerate(rows):
        for j in range(repeat):
            ids[i * repeat + j, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i * repeat + j, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


def _decode(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> str:
    kept = [int(t) for t, m in zip(ids, mask) if m and int(t) != tokenizer.eos_token_id]
    return " ".join(tokenizer.decode(kept, skip_special_tokens=True).split())


@torch.no_grad()
def _generate(
    model,
    tokenizer,
    prompts: Sequence[str],
    k: int,
    temperature: float,
    top_k: int | None,
    max_new_tokens: int,
    seed: int,
    batch_size: int,
) -> list[list[str]]:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        ids, mask = _left_padded(tokenizer, chunk, k, device)
        streams = RowStreams(
            [(torch.Generator().manual_seed(turn_seed(seed, start + i)), k) for i in range(len(chunk))]
        )
        rollout = sample(
            model,
            ids,
            mask,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            generator=streams,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            top_k=top_k,
        )
        texts = [_decode(tokenizer, r, m) for r, m in zip(rollout.completion_ids.cpu(), rollout.completion_mask.cpu())]
        out += [texts[i * k : (i + 1) * k] for i in range(len(chunk))]
    model.train(was_training)
    return out


def sample_candidates(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    k: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    top_k: int | None = None,
    batch_size: int = 64,
    keep_empty: bool = False,
) -> list[list[str]]:
    """Up to `k` distinct sampled completions of each prompt, in the order drawn (module docstring); an empty one
    (EOS first) is dropped unless `keep_empty` (where an empty completion means something: nothing to add)."""
    if temperature <= 0:
        raise ValueError(f"generation.temperature must be > 0 to sample candidates, got {temperature}")
    drawn = _generate(model, tokenizer, prompts, k, temperature, top_k, max_new_tokens, seed, batch_size)
    return [list(dict.fromkeys(t for t in texts if t or keep_empty)) for texts in drawn]


def greedy(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int, batch_size: int = 64) -> list[str]:
    """The greedy completion of each prompt (EOS and special tokens dropped, whitespace normalised)."""
    return [t[0] for t in _generate(model, tokenizer, prompts, 1, 0.0, None, max_new_tokens, 0, batch_size)]
