"""The kit's sampler: greedy decoding equals transformers' generate, recorded log-probs equal a recomputation
with `sequence_logprobs` at the same temperature, a hook that replaces nothing changes nothing, a hook's
tokens and log-probs are the ones recorded, draws follow the generator and the softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import StepOverride, sample, sequence_logprobs
from paperflow.core.lm.tokenizer import encode_words

WORLD = DigitWorld.from_config({"sorting": {"min_len": 2, "max_len": 7}})
TOK = WORLD.tokenizer()
SPECS = {
    "llama": {"arch": "llama", "num_key_value_heads": 2},
    "qwen2": {"arch": "qwen2", "num_key_value_heads": 1},
}
BASE = {
    "vocab_size": len(TOK),
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}


def _model(arch: str, seed: int = 0):
    return build_model({**BASE, **SPECS[arch]}, seed=seed).eval()


def _prompts(n: int = 6, seed: int = 0):
    examples = WORLD.sample("sorting", n, np.random.default_rng(seed))
    return encode_words(TOK, [ex.prompt for ex in examples])  # unequal lengths: left padding


def _run(model, batch, **kw):
    args = {"max_new_tokens": 8, "temperature": 1.0, "eos_token_id": TOK.eos_token_id, "pad_token_id": TOK.pad_token_id}
    args.update(kw)
    return sample(model, batch["input_ids"], batch["attention_mask"], **args)


def _eos_biased(model):
    """The model with EOS's logit raised to the median gap below the best logit at the prompts' ends, so about
    half the rows of `_prompts()` end at once and the others at later steps."""
    batch = _prompts()
    with torch.no_grad():
        logits = model(**batch).logits[:, -1]
    gap = (logits.max(-1).values - logits[:, TOK.eos_token_id]).median()
    bias = torch.zeros(len(TOK))
    bias[TOK.eos_token_id] = float(gap) + 1e-3
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    return model


@pytest.mark.parametrize("arch", sorted(SPECS))
@pytest.mark.parametrize("eos_biased", [False, True])
def test_greedy_equals_transformers_generate_on_a_left_padded_batch(arch, eos_biased):
    model = _model(arch)
    if eos_biased:
        model = _eos_biased(model)
    batch = _prompts()
    ours = _run(model, batch, temperature=0.0, generator=torch.Generator().manual_seed(0))
    ref = model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=8,
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
    )
    width = ours.sequences.shape[1]
    assert torch.equal(ours.sequences, ref[:, :width])
    assert (ref[:, width:] == TOK.pad_token_id).all()
    if eos_biased:  # the finished-row path is exercised: some rows stopped before others
        lengths = ours.completion_mask.sum(1)
        assert lengths.min() < lengths.max()


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.0])
def test_recorded_logprobs_equal_a_recomputation_at_the_same_temperature(temperature):
    model = _eos_biased(_model("llama"))
    r = _run(model, _prompts(), temperature=temperature, generator=torch.Generator().manual_seed(3))
    recomputed, ent = sequence_logprobs(
        model, r.sequences, r.attention_mask, temperature=temperature or 1.0, entropies=True
    )
    m = r.completion_mask.bool()
    p = r.prompt_length
    torch.testing.assert_close(recomputed[:, p:][m], r.logprobs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[:, p:][m], r.entropies[m], atol=1e-5, rtol=1e-5)
    assert (r.logprobs[~m] == 0).all() and (r.completion_ids[~m] == TOK.pad_token_id).all()
    if temperature == 2.0:  # the temperature is really applied: T = 1 gives other values
        plain = sequence_logprobs(model, r.sequences, r.attention_mask, temperature=1.0)
        assert not torch.allclose(plain[:, p:][m], r.logprobs[m], atol=1e-3)


def test_left_padding_does_not_change_a_rows_logprobs():
    model = _model("qwen2")
    batch = _prompts()
    full = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"])
    for i in range(batch["input_ids"].shape[0]):
        keep = batch["attention_mask"][i].bool()
        alone = sequence_logprobs(model, batch["input_ids"][i : i + 1, keep], batch["attention_mask"][i : i + 1, keep])
        torch.testing.assert_close(full[i, keep], alone[0], atol=1e-5, rtol=1e-5)


def test_a_hook_that_replaces_nothing_leaves_the_rollout_unchanged():
    model = _eos_biased(_model("llama"))
    batch = _prompts()
    plain = _run(model, batch, generator=torch.Generator().manual_seed(11))
    seen = []

    def idle(state):
        seen.append(state.step)
        return StepOverride(state.tokens * 0 + 5, state.entropies * 0, torch.zeros_like(state.done))

    hooked = _run(model, batch, generator=torch.Generator().manual_seed(11), hook=idle)
    assert seen == list(range(plain.completion_ids.shape[1]))
    for name in ("sequences", "completion_mask", "logprobs", "entropies", "replaced"):
        assert torch.equal(getattr(plain, name), getattr(hooked, name)), name
    none_hook = _run(model, batch, generator=torch.Generator().manual_seed(11), hook=lambda s: None)
    assert torch.equal(plain.sequences, none_hook.sequences)


def test_a_hooks_tokens_and_logprobs_are_what_the_rollout_records():
    model = _model("llama")
    batch = _prompts()
    forced = TOK.convert_tokens_to_ids("7")

    def inject(state):
        rows = torch.arange(state.tokens.shape[0]) % 2 == 0
        replace = rows & (torch.tensor(state.step) == 1)
        return StepOverride(torch.full_like(state.tokens, forced), torch.full_like(state.entropies, -0.25), replace)

    r = _run(model, batch, generator=torch.Generator().manual_seed(5), hook=inject)
    assert (r.completion_ids[0::2, 1] == forced).all()
    assert (r.logprobs[0::2, 1] == -0.25).all()
    assert r.replaced[0::2, 1].all() and r.replaced.sum() == r.replaced[0::2, 1].numel()
    # the policy's own probability of the injected token differs from what the hook recorded
    own = sequence_logprobs(model, r.sequences, r.attention_mask)[:, r.prompt_length + 1]
    assert not torch.allclose(own[0::2], torch.full_like(own[0::2], -0.25))


def test_draws_follow_the_generator():
    model = _model("qwen2")
    batch = _prompts()
    a = _run(model, batch, generator=torch.Generator().manual_seed(1))
    b = _run(model, batch, generator=torch.Generator().manual_seed(1))
    c = _run(model, batch, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.sequences, b.sequences) and not torch.equal(a.sequences, c.sequences)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_first_token_frequencies_match_the_tempered_softmax(temperature):
    model = _model("llama", seed=4)
    batch = encode_words(TOK, [["sort", "3", "1", "="]] * 4000)
    r = _run(model, batch, temperature=temperature, max_new_tokens=1, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(batch["input_ids"][:1]).logits[0, -1]
    probs = torch.softmax(logits.double() / temperature, -1).numpy()
    counts = np.bincount(r.completion_ids[:, 0].numpy(), minlength=len(probs))
    # 4000 draws: a binomial proportion's standard error is at most 0.008
    assert np.abs(counts / 4000 - probs).max() < 0.03
    assert chisquare(counts, probs / probs.sum() * counts.sum()).pvalue > 1e-3
    uniform = np.full(len(probs), 4000 / len(probs))
    assert chisquare(counts, uniform).pvalue < 1e-6  # the test can tell the softmax from uniform draws


def test_sequence_logprobs_is_differentiable():
    model = _model("llama")
    batch = _prompts()
    lp = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"])
    lp.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
