"""Batched, KV-cached sampling that records the log-probabilities of the distribution actually sampled, and the
one label-shift convention of the kit.

Conventions:
- Prompts are left-padded (`tokenizer.encode_words`); position ids come from the attention mask, so padding
  changes no logit.
- `sequence_logprobs(model, ids, mask)` has the shape of `ids`: entry i is log p(ids[i] | ids[:i]), 0 at
  padding and at each row's first real token. A completion mask from `encode_pairs` applies to it directly, and
  so does a `Rollout`'s: `sequence_logprobs(model, r.sequences, r.attention_mask, T)[:, r.prompt_length:]`
  equals `r.logprobs` where `r.completion_mask` is 1 (when no hook changed a recorded log-prob).
- Temperature T is applied once: the sampled distribution is softmax(logits / T), and the recorded log-probs
  and entropies are that distribution's. T = 0 decodes greedily (argmax of the logits, as `generate` does) and
  records the T = 1 distribution; `sequence_logprobs` also reads T = 0 as T = 1, so the equality above holds.
- Every random draw goes through the caller's `torch.Generator`: one float64 uniform per row and step, turned
  into a token by the inverse CDF, drawn whether the step is greedy or not and whether or not a hook replaces the
  token. A hook that replaces nothing therefore leaves the rollout bit for bit unchanged. A hook that draws
  random numbers of its own must use its own generator.

A hook sees each step before its tokens are committed and may replace tokens and the log-probs recorded for them:
EAPO injects the experience prior's token at critical steps and records the mixture's probability of it (the
prior runs on the same prefix through a `CachedForward` of its own).

    def hook(state: StepState) -> StepOverride | None: ...
    rollout = sample(model, ids, mask, max_new_tokens=4, temperature=1.0, generator=g,
                     eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, hook=hook)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2, ... over each row's real tokens; left padding sits at position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _check_left_padded(attention_mask: torch.Tensor) -> None:
    mask = attention_mask.long()
    if mask.ndim != 2 or mask.shape[1] == 0:
        raise ValueError(f"attention_mask must be [batch, length>0], got shape {tuple(mask.shape)}")
    if not bool((mask[:, -1] == 1).all()) or not bool((mask[:, 1:] >= mask[:, :-1]).all()):
        raise ValueError(
            "prompts must be left-padded (each mask row 0...0 1...1, ending in 1; tokenizer.encode_words pads so)"
        )


def _check_one_span(attention_mask: torch.Tensor) -> None:
    """Each row's real tokens must be one run (padding left and/or right of it). A hole inside a row would put the
    label shift across the gap: the token after it would be scored from the padding column's logits."""
    m = (attention_mask != 0).long()
    if m.ndim != 2:
        raise ValueError(f"attention_mask must be [batch, length], got shape {tuple(m.shape)}")
    starts = m[:, :1].sum(1) + (m[:, 1:] > m[:, :-1]).sum(1)
    if bool((starts > 1).any()):
        rows = torch.nonzero(starts > 1).flatten().tolist()[:5]
        raise ValueError(
            f"attention_mask rows {rows} have padding between real tokens; repack each row into one run "
            "(e.g. move the padding of a multi-turn history to the left) before scoring it"
        )


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Float32 logits divided by the temperature (T = 0 reads as 1: greedy decoding records the T = 1 law)."""
    logits = logits.float()
    return logits if temperature in (0, 1) else logits / temperature


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """-sum p log p, with 0 log 0 = 0 (a banned or top-k-truncated token has log-prob -inf)."""
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros_like(logp))).sum(-1)


def _forward_logprobs(model, input_ids, attention_mask, temperature: float, entropies: bool):
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask)
    ).logits
    scaled = _scaled(logits[:, :-1], temperature)
    keep = (attention_mask[:, 1:] != 0) & (attention_mask[:, :-1] != 0)  # a real token after a real one
    targets = input_ids[:, 1:, None]
    if entropies:
        logp_all = torch.log_softmax(scaled, dim=-1)
        picked = logp_all.gather(-1, targets).squeeze(-1)
        ent = torch.where(keep, _entropy(logp_all), 0.0)
    else:  # no [B, L, V] log-softmax kept: the token's logit minus the log-normaliser
        picked = scaled.gather(-1, targets).squeeze(-1) - scaled.logsumexp(-1)
        ent = None
    picked = torch.where(keep, picked, 0.0)
    first = torch.zeros_like(picked[:, :1])
    return torch.cat([first, picked], 1), None if ent is None else torch.cat([first, ent], 1)


def sequence_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    *,
    entropies: bool = False,
    chunk_size: int | None = None,
):
    """Per-token log-probs [B, L] of `input_ids` under softmax(logits / temperature), the label shift done here:
    out[:, i] = log p(input_ids[:, i] | input_ids[:, :i]); 0 at padding and at each row's first real token
    (it has no context). T = 0 reads as T = 1, like `sample`'s record.

    Differentiable when called under grad (training uses it); under `torch.no_grad()` with `chunk_size` rows per
    forward pass, memory stays at one chunk's logits. With `entropies`, returns (log-probs, entropies), the second
    the entropy [B, L] of the distribution each token was drawn from (same alignment, same zeros)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    _check_one_span(attention_mask)
    n = input_ids.shape[0]
    step = max(n, 1) if chunk_size is None else int(chunk_size)
    parts = [
        _forward_logprobs(model, input_ids[i : i + step], attention_mask[i : i + step], temperature, entropies)
        for i in range(0, max(n, 1), step)
    ]
    logp = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    if not entropies:
        return logp
    return logp, torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]


def sequence_entropies(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float = 1.0, *, chunk_size=None
) -> torch.Tensor:
    """Entropy [B, L] of the distribution each token of `input_ids` was drawn from (`sequence_logprobs`' alignment)."""
    return sequence_logprobs(model, input_ids, attention_mask, temperature, entropies=True, chunk_size=chunk_size)[1]


def cache_argument(module) -> str:
    """The name under which `module.forward` takes a transformers cache: transformers 5 renamed `past_key_values`
    to `cache` (the old name warns)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class CachedForward:
    """Next-token logits of a model along sequences that grow on the right, feeding only the columns new since the
    last call (a KV cache), with position ids from the attention mask. `sample` decodes through one; a hook runs a
    second model (EAPO's prior) on the same prefix through another, calling it at every step."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        self._cache_arg = cache_argument(model)
        self._seen: torch.Tensor | None = None

    @torch.no_grad()
    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits [B, V] at the last column of `input_ids` [B, L]; earlier columns must be the ones seen before.
        `inputs_embeds` [B, L, H] replaces the ids' embeddings on the first call only (a VLM's projected image
        prefix in its slots); the ids then stand for those columns in the cache's bookkeeping."""
        done = 0 if self._seen is None else self._seen.shape[1]
        if input_ids.shape[1] <= done or (self._seen is not None and not torch.equal(input_ids[:, :done], self._seen)):
            raise ValueError(
                f"CachedForward: the sequences must extend the {done} columns seen before by at least one on the right"
            )
        if inputs_embeds is not None and (done or inputs_embeds.shape[:2] != input_ids.shape):
            raise ValueError(
                f"CachedForward: inputs_embeds {tuple(inputs_embeds.shape)} goes with the first call's ids "
                f"{tuple(input_ids.shape)} only"
            )
        feed = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": input_ids[:, done:]}
        out = self.model(
            **feed,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask)[:, done:],
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: self.cache},
        )
        self._seen = input_ids
        return out.logits[:, -1]


@dataclass
class StepState:
    """What a hook sees at step t, before the step's tokens are committed."""

    step: int  # t, 0 for the first new token
    logprobs: torch.Tensor  # [B, V] log of the sampled distribution, softmax(logits / T) (T = 1 when greedy)
    entropies: torch.Tensor  # [B] its entropy
    tokens: torch.Tensor  # [B] the policy's own choice (its draw, or the argmax when T = 0)
    input_ids: torch.Tensor  # [B, P + t] the sequences so far
    attention_mask: torch.Tensor  # [B, P + t]
    done: torch.Tensor  # [B] bool, rows that already emitted EOS (their token will be padding, overrides ignored)
    temperature: float  # T, to apply the same one to another model's logits


@dataclass
class StepOverride:
    """A hook's answer. Rows with `replace` take `tokens`. Rows with `record` (default: the replaced rows, if
    `logprobs` is given) get `logprobs` as their recorded log-prob: the probability the token was really sampled
    with, e.g. EAPO's mixture mu, which holds at every critical step whether or not the prior's token was injected.
    Every other row records the sampled distribution's log-prob of its final token (with `logprobs` None, a
    replaced row records the policy's log-prob of the token put in: a forced token, to be masked by `replaced`)."""

    tokens: torch.Tensor  # [B] long
    logprobs: torch.Tensor | None  # [B]
    replace: torch.Tensor  # [B] bool
    record: torch.Tensor | None = None  # [B] bool


Hook = Callable[[StepState], "StepOverride | None"]


@dataclass
class Rollout:
    """Prompts and their sampled completions (T <= max_new_tokens columns: sampling stops when all rows ended)."""

    sequences: torch.Tensor  # [B, P + T] prompt + completion, padding after EOS
    attention_mask: torch.Tensor  # [B, P + T] long
    prompt_length: int  # P
    completion_ids: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T] long, 1 up to and including EOS
    logprobs: torch.Tensor  # [B, T] log-prob each token was sampled with (0 under the mask's zeros)
    entropies: torch.Tensor  # [B, T] entropy of the policy's sampled distribution (0 under the mask's zeros)
    replaced: torch.Tensor  # [B, T] bool, tokens a hook put in


def _restrict(logits: torch.Tensor, banned: torch.Tensor | None, top_k: int | None) -> torch.Tensor:
    """Banned ids to -inf, then all but the k largest logits to -inf (ties at the k-th kept)."""
    if banned is not None:
        logits = logits.float().index_fill(-1, banned, float("-inf"))
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of the law exp(logp) [B, V] at the float64 uniforms u [B, 1]: the first index whose
    (renormalised, float64) cumulative probability exceeds u, never a zero-probability index. The draw `sample`
    makes; a hook that draws from another law (eapo's prior) uses it too."""
    cdf = logp.double().exp().cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logp.shape[-1] - 1)


class RowStreams:
    """Generators for consecutive row blocks of one batch: [(generator, rows), ...] in row order. `sample` given
    one draws each block's uniforms from its own generator, so a block's samples are those it would get sampled
    alone with that generator (the kit's local server batches requests so, each with its own seed)."""

    def __init__(self, blocks: Sequence[tuple[torch.Generator, int]]):
        self.blocks = [(g, int(n)) for g, n in blocks]

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.blocks)

    def uniforms(self, rows: int, device) -> torch.Tensor:
        if rows != self.rows:
            raise ValueError(f"RowStreams covers {self.rows} rows, the batch has {rows}")
        parts = [torch.rand(n, 1, generator=g, dtype=torch.float64) for g, n in self.blocks]
        return torch.cat(parts).to(device)


def _draw(logits: torch.Tensor, logp: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    """One token per row by the inverse CDF of exp(logp) at a float64 uniform; the uniform is drawn even when
    greedy (argmax of the raw logits, `generate`'s tie-breaking), so the generator always advances the same."""
    if isinstance(generator, RowStreams):
        u = generator.uniforms(logp.shape[0], logp.device)
    else:
        u = torch.rand(logp.shape[0], 1, generator=generator, dtype=torch.float64, device=logp.device)
    if temperature == 0:
        return logits.argmax(-1)
    return inverse_cdf(logp, u)


def _apply(override: StepOverride, live, token, token_logp, logp):
    """(token, recorded log-prob, replaced) after a hook's override; shapes checked, finished rows untouched."""
    batch = token.shape[0]
    for name in ("tokens", "logprobs", "replace", "record"):
        value = getattr(override, name)
        if value is not None and tuple(value.shape) != (batch,):
            raise ValueError(f"StepOverride.{name} must have shape ({batch},), got {tuple(value.shape)}")
    replaced = override.replace.bool() & live
    if override.record is not None:
        record = override.record.bool() & live
    else:
        record = replaced if override.logprobs is not None else torch.zeros_like(replaced)
    if bool(record.any()) and override.logprobs is None:
        raise ValueError("StepOverride: rows to record but no logprobs given")
    token = torch.where(replaced, override.tokens.to(token), token)
    token_logp = torch.where(replaced, logp.gather(-1, token[:, None]).squeeze(-1), token_logp)
    if override.logprobs is not None:
        token_logp = torch.where(record, override.logprobs.to(token_logp), token_logp)
    return token, token_logp, replaced


@torch.no_grad()
def sample(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator | RowStreams | None,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    hook: Hook | None = None,
    inputs_embeds: torch.Tensor | None = None,
    banned_token_ids: Sequence[int] | None = None,
    top_k: int | None = None,
) -> Rollout:
    """Up to `max_new_tokens` per row from left-padded prompts, KV-cached; a row ends at its first EOS (any of
    `eos_token_id`; None: never), later columns are `pad_token_id` under mask 0; sampling stops when all rows ended.
    `hook(StepState)` may return a `StepOverride` at every step (module docstring).

    inputs_embeds: [B, L, H] embeddings of the prompt fed instead of its ids on the first forward (a VLM's image
        prefix); the ids still fill `sequences`.
    banned_token_ids: never drawn (their logits -inf before anything else).
    top_k: only the k largest logits of each step stay (None or 0: all); the recorded log-probs and entropies are
        those of the truncated, tempered law actually sampled."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    _check_left_padded(attention_mask)
    batch, prompt_len = input_ids.shape
    device = input_ids.device
    eos = torch.as_tensor([] if eos_token_id is None else eos_token_id, dtype=torch.long, device=device).reshape(-1)
    seq, mask = input_ids, attention_mask.long()
    forward = CachedForward(model)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens_out, logp_out, ent_out, repl_out, live_out = [], [], [], [], []
    banned = None if not banned_token_ids else torch.as_tensor(list(banned_token_ids), dtype=torch.long, device=device)
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None: no truncation), got {top_k}")
    for t in range(max_new_tokens):
        logits = forward(seq, mask, inputs_embeds if t == 0 else None)
        logits = _restrict(logits, banned, top_k)
        logp = torch.log_softmax(_scaled(logits, temperature), dim=-1)
        ent = _entropy(logp)
        token = _draw(logits, logp, temperature, generator)
        token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
        live = ~done
        replaced = torch.zeros_like(done)
        if hook is not None:
            override = hook(StepState(t, logp, ent, token, seq, mask, done.clone(), float(temperature)))
            if override is not None:
                token, token_logp, replaced = _apply(override, live, token, token_logp, logp)
        token = torch.where(live, token, pad_token_id)
        tokens_out.append(token)
        logp_out.append(torch.where(live, token_logp, 0.0))
        ent_out.append(torch.where(live, ent, 0.0))
        repl_out.append(replaced)
        live_out.append(live)
        seq = torch.cat([seq, token[:, None]], dim=1)
        mask = torch.cat([mask, live.long()[:, None]], dim=1)
        done = done | (live & torch.isin(token, eos))
        if bool(done.all()):
            break

    def stack(rows: list[torch.Tensor], dtype) -> torch.Tensor:
        return torch.stack(rows, 1) if rows else torch.zeros(batch, 0, dtype=dtype, device=device)

    return Rollout(
        sequences=seq,
        attention_mask=mask,
        prompt_length=prompt_len,
        completion_ids=stack(tokens_out, input_ids.dtype),
        completion_mask=stack(live_out, torch.bool).long(),
        logprobs=stack(logp_out, torch.float32),
        entropies=stack(ent_out, torch.float32),
        replaced=stack(repl_out, torch.bool),
    )


def repack_left(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int, *aligned: torch.Tensor):
    """Each row's real tokens (mask != 0), in their order, moved to the right end of the row and padding to the
    left: the layout `sample` and `sequence_logprobs` take. Joins multi-turn pieces that were padded apart (a
    turn's completion padded after EOS, then the next turn appended). Returns (input_ids, attention_mask) of width
    = the longest row's real length, followed by each of the `aligned` tensors [B, L] (a response mask, per-token
    rewards) moved the same way, 0 on the padding."""
    mask = attention_mask != 0
    if input_ids.shape != mask.shape or mask.ndim != 2:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(mask.shape)} must be [B, L]")
    lengths = mask.sum(1)
    width = int(lengths.max()) if mask.numel() else 0
    # a stable sort that puts padding first keeps the real tokens' order
    order = torch.sort(mask.long(), dim=1, stable=True).indices
    ids = torch.gather(input_ids, 1, order)[:, input_ids.shape[1] - width :]
    new_mask = torch.gather(mask.long(), 1, order)[:, input_ids.shape[1] - width :]
    ids = torch.where(new_mask.bool(), ids, torch.as_tensor(pad_token_id, dtype=ids.dtype))
    moved = []
    for a in aligned:
        if a.shape != mask.shape:
            raise ValueError(f"an aligned tensor {tuple(a.shape)} must have the ids' shape {tuple(mask.shape)}")
        a = torch.gather(a, 1, order)[:, input_ids.shape[1] - width :]
        moved.append(torch.where(new_mask.bool(), a, torch.zeros((), dtype=a.dtype)))
    return (ids, new_mask, *moved) if aligned else (ids, new_mask)


@dataclass
class MaskedOutput:
    """What `masked_forward` returns: logits [B, L, V] (None for a bare encoder) and the chosen layers' hidden
    states concatenated on the last axis, [B, L, len(layers) * H] (None when no layer was asked for)."""

    logits: torch.Tensor | None
    features: torch.Tensor | None


def masked_forward(
    model,
    allowed: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    input_ids: torch.Tensor | None = None,
    inputs_embeds: torch.Tensor | None = None,
    layers: Sequence[int] = (),
) -> MaskedOutput:
    """One forward pass of a causal LM under an arbitrary attention pattern: `allowed` [B, L, L] (bool; row i may
    attend to column i' where True) and explicit `position_ids` [B, L]. The pattern replaces causality, so a
    token tree (each node seeing its ancestors), tokens that only some rows may see (ConFu's soft prompts and
    contemplate tokens) or several unrolled draft steps fit in one pass. Every row must see itself (a row that
    sees nothing has no softmax). `layers` picks hidden states to return: i in 1..num_hidden_layers-1 is decoder
    layer i's output (0 the embeddings; the last layer's raw output is not returned by transformers, only after
    the final norm), concatenated in the order given (EAGLE-3's low/mid/high feature fusion).

    Differentiable under grad; the logits are the model's own (no temperature, no label shift)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("masked_forward takes exactly one of input_ids and inputs_embeds")
    shape = tuple((input_ids if input_ids is not None else inputs_embeds).shape[:2])
    if allowed.dtype != torch.bool or tuple(allowed.shape) != (*shape, shape[1]):
        raise ValueError(
            f"allowed must be a bool tensor of shape {(*shape, shape[1])} (batch, query, key), got "
            f"{allowed.dtype} {tuple(allowed.shape)}"
        )
    if tuple(position_ids.shape) != shape:
        raise ValueError(f"position_ids must have shape {shape}, got {tuple(position_ids.shape)}")
    if not bool(allowed.diagonal(dim1=1, dim2=2).all()):
        raise ValueError("allowed: every row must attend to itself (its diagonal must be True)")
    n_layers = int(model.config.num_hidden_layers)
    bad = [i for i in layers if not 0 <= int(i) < n_layers]
    if bad:
        raise ValueError(
            f"layers {bad} out of range 0 (embeddings) .. {n_layers - 1}: transformers returns the last decoder "
            "layer's output only after the final norm, so it is not offered"
        )
    feed = {"input_ids": input_ids} if input_ids is not None else {"inputs_embeds": inputs_embeds}
    out = model(
        **feed,
        attention_mask=allowed[:, None],
        position_ids=position_ids,
        output_hidden_states=bool(layers),
        use_cache=False,
    )
    logits = getattr(out, "logits", None)
    if not layers:
        return MaskedOutput(logits, None)
    return MaskedOutput(logits, torch.cat([out.hidden_states[int(i)] for i in layers], -1))
