"""Batched, KV-cached sampling with the log-probabilities of the distribution actually sampled, and the one
label-shift convention of the kit.

Conventions:
- Prompts are left-padded (`tokenizer.encode_words`); position ids come from the attention mask, so padding
  changes no logit.
- `sequence_logprobs(model, ids, mask)` has the shape of `ids`: entry i is log p(ids[i] | ids[:i]), 0 at
  padding and at each row's first real token. A completion mask from `encode_pairs` or a `Rollout` applies to it directly.
- Temperature T is applied once: the sampled distribution is softmax(logits / T), and the recorded log-probs
  and entropies are that distribution's. T = 0 decodes greedily and records the T = 1 distribution.
- Every random draw goes through the caller's `torch.Generator`, one uniform per row and step whether or not
  a hook replaces the token, so a hook that replaces nothing leaves the rollout bit for bit unchanged.

A hook sees each step before its token is committed and may replace tokens: EAPO injects the prior's action
at critical steps and records the mixture's probability of it.

    def hook(state: StepState) -> StepOverride | None: ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over each row's real tokens (left padding sits at position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _log_dist(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float() if temperature in (0, 1) else logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1)


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    return -(logp.exp() * logp).sum(-1)


def sequence_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0, entropies: bool = False
):
    """Per-token log-probs [B, L] of `input_ids` under the model at `temperature` (the label shift done here):
    out[:, i] = log p(input_ids[:, i] | input_ids[:, :i]); 0 at padding and at each row's first real token
    (it has no context). Differentiable.
    With `entropies`, also the entropy [B, L] of the distribution each token was drawn from (same alignment)."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits
    logp_all = _log_dist(logits[:, :-1], temperature)
    picked = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    keep = (attention_mask[:, 1:] * attention_mask[:, :-1]).to(picked.dtype)  # a real token after a real one
    out = torch.cat([torch.zeros_like(picked[:, :1]), picked * keep], dim=1)
    if not entropies:
        return out
    ent = torch.cat([torch.zeros_like(picked[:, :1]), _entropy(logp_all) * keep], dim=1)
    return out, ent


@dataclass
class StepState:
    """What a hook sees at step t, before the step's tokens are committed."""

    step: int
    logprobs: torch.Tensor  # [B, V] log of the sampled distribution (after temperature)
    entropies: torch.Tensor  # [B] its entropy
    tokens: torch.Tensor  # [B] the policy's own draw
    input_ids: torch.Tensor  # [B, P + t] the sequences so far
    attention_mask: torch.Tensor  # [B, P + t]
    done: torch.Tensor  # [B] rows that already emitted EOS (their token will be padding)


@dataclass
class StepOverride:
    """A hook's answer: rows with `replace` take `tokens`, and the rollout records `logprobs` for them (the
    probability the token was really sampled with, e.g. EAPO's mixture mu)."""

    tokens: torch.Tensor  # [B] long
    logprobs: torch.Tensor  # [B]
    replace: torch.Tensor  # [B] bool


Hook = Callable[[StepState], "StepOverride | None"]


@dataclass
class Rollout:
    """Prompts and their sampled completions."""

    sequences: torch.Tensor  # [B, P + T] prompt + completion, padding after EOS
    attention_mask: torch.Tensor  # [B, P + T]
    prompt_length: int  # P
    completion_ids: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T] 1 up to and including EOS
    logprobs: torch.Tensor  # [B, T] log-prob each token was sampled with (0 under the mask's zeros)
    entropies: torch.Tensor  # [B, T] entropy of the policy's sampled distribution
    replaced: torch.Tensor  # [B, T] bool, tokens a hook put in


def _draw(logp: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row; a uniform per row is drawn even when greedy, so the generator advances the same."""
    u = torch.rand(logp.shape[0], 1, generator=generator, dtype=torch.float64, device=logp.device)
    if temperature == 0:
        return logp.argmax(-1)
    cdf = logp.double().exp().cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=logp.shape[-1] - 1)


@torch.no_grad()
def sample(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | None,
    eos_token_id: int,
    pad_token_id: int,
    hook: Hook | None = None,
) -> Rollout:
    """Sample up to `max_new_tokens` per row with a KV cache; rows stop at EOS, all stop when every row has."""
    from transformers import DynamicCache

    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    batch, prompt_len = input_ids.shape
    seq, mask = input_ids, attention_mask.long()
    cache = DynamicCache()
    step_ids, positions = seq, position_ids_from_mask(mask)
    done = torch.zeros(batch, dtype=torch.bool, device=seq.device)
    tokens_out, logp_out, ent_out, repl_out, live_out = [], [], [], [], []
    for t in range(max_new_tokens):
        out = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        logp = _log_dist(out.logits[:, -1], temperature)
        ent = _entropy(logp)
        token = _draw(logp, temperature, generator)
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
        replaced = torch.zeros(batch, dtype=torch.bool, device=seq.device)
        if hook is not None:
            override = hook(StepState(t, logp, ent, token, seq, mask, done.clone()))
            if override is not None:
                replaced = override.replace.bool() & ~done
                token = torch.where(replaced, override.tokens.long(), token)
                token_logp = torch.where(replaced, override.logprobs.to(token_logp.dtype), token_logp)
        live = ~done
        token = torch.where(live, token, torch.full_like(token, pad_token_id))
        tokens_out.append(token)
        logp_out.append(torch.where(live, token_logp, torch.zeros_like(token_logp)))
        ent_out.append(torch.where(live, ent, torch.zeros_like(ent)))
        repl_out.append(replaced & live)
        live_out.append(live)
        seq = torch.cat([seq, token[:, None]], dim=1)
        mask = torch.cat([mask, live.long()[:, None]], dim=1)
        done = done | (live & (token == eos_token_id))
        step_ids = token[:, None]
        positions = (position_ids_from_mask(mask)[:, -1:]).clone()
        if bool(done.all()):
            break
    completion = torch.stack(tokens_out, dim=1)
    return Rollout(
        sequences=seq,
        attention_mask=mask,
        prompt_length=prompt_len,
        completion_ids=completion,
        completion_mask=torch.stack(live_out, dim=1).long(),
        logprobs=torch.stack(logp_out, dim=1),
        entropies=torch.stack(ent_out, dim=1),
        replaced=torch.stack(repl_out, dim=1),
    )
