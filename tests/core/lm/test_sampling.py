"""The kit's sampler: greedy decoding equals transformers' generate, recorded log-probs equal a recomputation
with `sequence_logprobs` at the same temperature, left padding changes nothing, a hook that replaces nothing
changes nothing, a hook's tokens and log-probs are the ones recorded, draws follow the generator and the softmax."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import (
    CachedForward,
    StepOverride,
    masked_forward,
    position_ids_from_mask,
    sample,
    sequence_entropies,
    sequence_logprobs,
)
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


def _model(arch: str = "llama", seed: int = 0):
    return build_model({**BASE, **SPECS[arch]}, seed=seed).eval()


def _prompts(n: int = 6, seed: int = 0):
    examples = WORLD.sample("sorting", n, np.random.default_rng(seed))
    batch = encode_words(TOK, [ex.prompt for ex in examples])
    assert batch["attention_mask"].sum(1).min() < batch["attention_mask"].shape[1]  # unequal lengths: left padding
    return batch


def _run(model, batch, seed: int = 0, **kw):
    args = {
        "max_new_tokens": 8,
        "temperature": 1.0,
        "eos_token_id": TOK.eos_token_id,
        "pad_token_id": TOK.pad_token_id,
        "generator": torch.Generator().manual_seed(seed),
    }
    args.update(kw)
    return sample(model, batch["input_ids"], batch["attention_mask"], **args)


def _eos_biased(model):
    """The model with EOS's logit raised to the median gap below the best logit at the prompts' ends, so about
    half the rows of `_prompts()` end at once and the others at later steps."""
    batch = _prompts()
    with torch.no_grad():
        logits = model(**batch, position_ids=position_ids_from_mask(batch["attention_mask"])).logits[:, -1]
    gap = (logits.max(-1).values - logits[:, TOK.eos_token_id]).median()
    bias = torch.zeros(len(TOK))
    bias[TOK.eos_token_id] = float(gap) + 1e-3
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    return model


def _no_eos(model):
    """The model with EOS's logit at -1e9: rows end only where a hook injects EOS."""
    bias = torch.zeros(len(TOK))
    bias[TOK.eos_token_id] = -1e9
    model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    return model


def _assert_ended_rows_are_padding(r):
    m = r.completion_mask.bool()
    assert (r.completion_ids[~m] == TOK.pad_token_id).all()
    assert (r.logprobs[~m] == 0).all() and (r.entropies[~m] == 0).all() and not r.replaced[~m].any()
    # the mask is 1 up to and including the first EOS, and the sequence mask is the prompt's then the completion's
    is_eos = (r.completion_ids == TOK.eos_token_id) & m
    ended_before = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    assert torch.equal(m, ~ended_before)
    assert torch.equal(r.attention_mask[:, r.prompt_length :], r.completion_mask)
    assert torch.equal(r.sequences[:, r.prompt_length :], r.completion_ids)


@pytest.mark.parametrize("arch", sorted(SPECS))
@pytest.mark.parametrize("eos_biased", [False, True])
def test_greedy_equals_transformers_generate_on_a_left_padded_batch(arch, eos_biased):
    model = _model(arch)
    if eos_biased:
        model = _eos_biased(model)
    batch = _prompts()
    ours = _run(model, batch, temperature=0.0)
    ref = model.generate(
        **batch, do_sample=False, max_new_tokens=8, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id
    )
    width = ours.sequences.shape[1]
    assert torch.equal(ours.sequences, ref[:, :width])
    assert (ref[:, width:] == TOK.pad_token_id).all()
    _assert_ended_rows_are_padding(ours)
    lengths = ours.completion_mask.sum(1)
    if eos_biased:  # the finished-row path is exercised: some rows stopped before others, and sampling stopped early
        assert lengths.min() < lengths.max() and width < batch["input_ids"].shape[1] + 8
    else:
        assert (lengths == 8).all()


def test_greedy_rows_alone_equal_the_rows_in_a_left_padded_batch():
    model = _eos_biased(_model("llama"))
    batch = _prompts()
    together = _run(model, batch, temperature=0.0)
    for i in range(batch["input_ids"].shape[0]):
        keep = batch["attention_mask"][i].bool()
        row = {k: v[i : i + 1, keep] for k, v in batch.items()}
        alone = _run(model, row, temperature=0.0)
        n = alone.completion_ids.shape[1]
        assert torch.equal(alone.completion_ids[0], together.completion_ids[i, :n])
        assert int(alone.completion_mask.sum()) == int(together.completion_mask[i].sum())
        torch.testing.assert_close(alone.logprobs[0], together.logprobs[i, :n], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(alone.entropies[0], together.entropies[i, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.0])
def test_recorded_logprobs_equal_a_recomputation_at_the_same_temperature(temperature):
    model = _eos_biased(_model("llama"))
    batch = _prompts()
    r = _run(model, batch, seed=3, temperature=temperature)
    _assert_ended_rows_are_padding(r)
    recomputed, ent = sequence_logprobs(model, r.sequences, r.attention_mask, temperature, entropies=True)
    m, p = r.completion_mask.bool(), r.prompt_length
    torch.testing.assert_close(recomputed[:, p:][m], r.logprobs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[:, p:][m], r.entropies[m], atol=1e-5, rtol=1e-5)
    # the first new token, from the model's logits directly: log_softmax(logits / T), T = 0 recording T = 1
    with torch.no_grad():
        logits = model(**batch, position_ids=position_ids_from_mask(batch["attention_mask"])).logits[:, -1]
    first = torch.log_softmax(logits / (temperature or 1.0), -1).gather(-1, r.completion_ids[:, :1])[:, 0]
    torch.testing.assert_close(r.logprobs[:, 0], first, atol=1e-5, rtol=1e-5)
    if temperature == 2.0:  # the temperature is really applied: T = 1 gives other values
        plain = sequence_logprobs(model, r.sequences, r.attention_mask, temperature=1.0)
        assert not torch.allclose(plain[:, p:][m], r.logprobs[m], atol=1e-3)


def test_sequence_logprobs_left_padding_chunks_and_entropies():
    model = _model("qwen2")
    batch = _prompts()
    full, ent = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], entropies=True)
    assert full.shape == batch["input_ids"].shape == ent.shape
    assert (full[:, 0] == 0).all() and (full[batch["attention_mask"] == 0] == 0).all()
    for i in range(batch["input_ids"].shape[0]):
        keep = batch["attention_mask"][i].bool()
        alone = sequence_logprobs(model, batch["input_ids"][i : i + 1, keep], batch["attention_mask"][i : i + 1, keep])
        torch.testing.assert_close(full[i, keep], alone[0], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        chunked = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], chunk_size=4)
        chunked_ent = sequence_entropies(model, batch["input_ids"], batch["attention_mask"], chunk_size=4)
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chunked_ent, ent, atol=1e-6, rtol=1e-6)
    assert (ent[:, 1:][batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1] == 1] > 0).all()


def test_a_hook_that_replaces_nothing_leaves_the_rollout_unchanged():
    model = _eos_biased(_model("llama"))
    batch = _prompts()
    plain = _run(model, batch, seed=11)
    seen = []

    def idle(state):
        seen.append(state.step)
        assert state.input_ids.shape[1] == batch["input_ids"].shape[1] + state.step
        return StepOverride(state.tokens * 0 + 5, state.entropies * 0, torch.zeros_like(state.done))

    for hook in (idle, lambda state: None):
        hooked = _run(model, batch, seed=11, hook=hook)
        for name in ("sequences", "attention_mask", "completion_mask", "logprobs", "entropies", "replaced"):
            assert torch.equal(getattr(plain, name), getattr(hooked, name)), name
    assert seen == list(range(plain.completion_ids.shape[1]))
    assert plain.completion_mask.sum(1).min() < plain.completion_mask.shape[1]  # some rows ended early


def test_a_hooks_tokens_and_logprobs_are_what_the_rollout_records():
    model = _no_eos(_model("llama"))
    batch = _prompts()
    forced = TOK.convert_tokens_to_ids("7")
    even = torch.arange(batch["input_ids"].shape[0]) % 2 == 0

    def inject(state):
        tokens = torch.full_like(state.tokens, forced)
        if state.step == 1:  # even rows take "7" with a made-up behaviour log-prob
            return StepOverride(tokens, torch.full_like(state.entropies, -0.25), even)
        if state.step == 2:  # odd rows: a log-prob recorded without a token replaced (EAPO: critical, not injected)
            return StepOverride(tokens, torch.full_like(state.entropies, -0.5), torch.zeros_like(even), record=~even)
        if state.step == 3:  # all rows take "7" and, no log-prob given, record the policy's own log-prob of it
            return StepOverride(tokens, None, torch.ones_like(even))
        return None

    r = _run(model, batch, seed=5, hook=inject)
    own = sequence_logprobs(model, r.sequences, r.attention_mask)[:, r.prompt_length :]
    assert (r.completion_ids[even, 1] == forced).all() and (r.logprobs[even, 1] == -0.25).all()
    assert not torch.allclose(own[even, 1], torch.full_like(own[even, 1], -0.25))
    assert (r.logprobs[~even, 2] == -0.5).all()
    assert (r.completion_ids[:, 3] == forced).all()
    recorded_own = torch.ones_like(r.logprobs, dtype=torch.bool)
    recorded_own[even, 1] = recorded_own[~even, 2] = False
    torch.testing.assert_close(r.logprobs[recorded_own], own[recorded_own], atol=1e-5, rtol=1e-5)
    expected = torch.zeros_like(r.replaced)
    expected[even, 1] = expected[:, 3] = True
    assert torch.equal(r.replaced, expected)
    # the policy's draws at the other steps are the ones of the run without the hook (same generator stream)
    plain = _run(model, batch, seed=5)
    assert torch.equal(plain.completion_ids[:, 0], r.completion_ids[:, 0])


def test_a_hook_that_injects_eos_ends_those_rows_and_is_ignored_on_ended_rows():
    model = _no_eos(_model("qwen2"))
    batch = _prompts()
    n = batch["input_ids"].shape[0]
    first_half = torch.arange(n) < n // 2

    def stop(state):
        eos = torch.full_like(state.tokens, TOK.eos_token_id)
        if state.step == 2:
            return StepOverride(eos, torch.zeros(n), first_half)
        if state.step >= 3:  # overrides of ended rows are ignored; the others end at step 5
            assert torch.equal(state.done, first_half)
            return StepOverride(eos, torch.zeros(n), torch.full((n,), state.step == 5))
        return None

    r = _run(model, batch, hook=stop)
    _assert_ended_rows_are_padding(r)
    assert r.completion_ids.shape[1] == 6  # stopped early: every row ended
    assert (r.completion_mask.sum(1) == torch.where(first_half, 3, 6)).all()
    assert r.replaced[:, 2].tolist() == first_half.tolist() and not r.replaced[first_half, 3:].any()


def test_a_second_model_on_the_same_prefix_through_cached_forward():
    """EAPO's prior: a CachedForward of another model called by the hook at every step sees the prefix the policy
    sees; with the prior := the policy its tempered log-probs are the policy's (the identity-prior check)."""
    model, other = _model("llama"), _model("llama", seed=7)
    batch = _prompts()
    same, prior = CachedForward(model), CachedForward(other)
    gaps = []

    def watch(state):
        mine = torch.log_softmax(same(state.input_ids, state.attention_mask) / state.temperature, -1)
        gaps.append(float((mine - state.logprobs).abs().max()))
        theirs = prior(state.input_ids, state.attention_mask)
        pos = position_ids_from_mask(state.attention_mask)
        full = other(input_ids=state.input_ids, attention_mask=state.attention_mask, position_ids=pos).logits[:, -1]
        torch.testing.assert_close(theirs, full, atol=1e-5, rtol=1e-5)
        return None

    with torch.no_grad():
        _run(model, batch, temperature=2.0, hook=watch)
    assert len(gaps) == 8 and max(gaps) < 1e-5
    with pytest.raises(ValueError, match="extend"):
        same(batch["input_ids"], batch["attention_mask"])  # not longer than what it has seen


def test_draws_follow_the_generator():
    model = _model("qwen2")
    batch = _prompts()
    a, b, c = _run(model, batch, seed=1), _run(model, batch, seed=1), _run(model, batch, seed=2)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.sequences, c.sequences)
    # the caller's global torch stream is neither used nor moved
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    _run(model, batch, seed=1)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_first_token_frequencies_match_the_tempered_softmax(temperature):
    model = _model("llama", seed=4)
    n = 4000
    batch = encode_words(TOK, [["sort", "3", "1", "="]] * n)
    r = _run(model, batch, temperature=temperature, max_new_tokens=1)
    with torch.no_grad():
        logits = model(batch["input_ids"][:1]).logits[0, -1]
    probs = torch.softmax(logits.double() / temperature, -1).numpy()
    counts = np.bincount(r.completion_ids[:, 0].numpy(), minlength=len(probs))
    # 4000 draws: a binomial proportion's standard error is at most 0.008
    assert np.abs(counts / n - probs).max() < 0.03
    assert chisquare(counts, probs / probs.sum() * n).pvalue > 1e-3
    assert chisquare(counts, np.full(len(probs), n / len(probs))).pvalue < 1e-6  # it can tell softmax from uniform


def test_sequence_logprobs_is_differentiable():
    model = _model("llama")
    batch = _prompts()
    lp = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=0.7)
    assert lp.requires_grad
    lp.sum().backward()
    grad = model.model.embed_tokens.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_arguments_are_checked():
    model = _model("llama")
    batch = _prompts()
    right = {k: v.flip(1) for k, v in batch.items()}  # right padding
    with pytest.raises(ValueError, match="left-padded"):
        _run(model, right)
    with pytest.raises(ValueError, match="temperature"):
        _run(model, batch, temperature=-1.0)
    empty = _run(model, batch, max_new_tokens=0)
    assert empty.completion_ids.shape == (batch["input_ids"].shape[0], 0)
    assert torch.equal(empty.sequences, batch["input_ids"])
    with pytest.raises(ValueError, match="shape"):
        _run(model, batch, hook=lambda s: StepOverride(s.tokens[:2], None, torch.zeros(2, dtype=torch.bool)))


def test_sequence_logprobs_refuses_padding_inside_a_row():
    """A hole in a row's mask would score the token after it from the padding column: refused, by row; left and
    right padding around one run of real tokens stay allowed."""
    from paperflow.core.lm.models import build_model
    from paperflow.core.lm.sampling import sequence_logprobs

    model = build_model(
        {
            "arch": "llama",
            "vocab_size": 12,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 16,
        },
        seed=0,
    )
    ids = torch.randint(4, 12, (3, 6), generator=torch.Generator().manual_seed(0))
    ok = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 0]])
    assert sequence_logprobs(model, ids, ok).shape == (3, 6)
    holed = ok.clone()
    holed[1] = torch.tensor([1, 1, 0, 1, 0, 0])
    with pytest.raises(ValueError, match=r"rows \[1\] have padding between real tokens"):
        sequence_logprobs(model, ids, holed)


def test_repack_left_joins_padded_pieces_in_order_and_scores_like_unpadded_rows():
    """Multi-turn pieces padded apart become one left-padded run per row, tokens in order; the log-probs of the
    repacked batch equal those of each row alone."""
    from paperflow.core.lm.models import build_model
    from paperflow.core.lm.sampling import repack_left, sequence_logprobs

    ids = torch.tensor([[0, 5, 6, 0, 7, 8], [9, 10, 11, 0, 0, 4], [0, 0, 5, 0, 0, 6]])
    mask = (ids != 0).long()
    out, m = repack_left(ids, mask, pad_token_id=0)
    assert out.tolist() == [[5, 6, 7, 8], [9, 10, 11, 4], [0, 0, 5, 6]]
    assert m.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]]
    model = build_model(
        {
            "arch": "qwen2",
            "vocab_size": 12,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 16,
        },
        seed=0,
    )
    with torch.no_grad():
        batch = sequence_logprobs(model, out, m)
        for i in range(3):
            real = out[i][m[i].bool()][None]
            alone = sequence_logprobs(model, real, torch.ones_like(real))
            torch.testing.assert_close(batch[i][m[i].bool()], alone[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="must be"):
        repack_left(ids, mask[:, :3], 0)


def test_inverse_cdf_follows_the_law_and_never_draws_a_zero_probability_index():
    from paperflow.core.lm.sampling import inverse_cdf

    probs = torch.tensor([[0.2, 0.0, 0.5, 0.3]] * 40000, dtype=torch.float64)
    u = torch.rand(40000, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    idx = inverse_cdf(probs.log(), u)
    freq = torch.bincount(idx, minlength=4).double() / 40000
    assert torch.allclose(freq, probs[0], atol=0.01) and freq[1] == 0
    # the boundaries: u just below / at a cumulative step
    edges = torch.tensor([[0.0], [0.2 - 1e-12], [0.2], [0.7 - 1e-12], [0.7], [1 - 1e-12]], dtype=torch.float64)
    assert inverse_cdf(probs[:6].log(), edges).tolist() == [0, 0, 2, 2, 3, 3]


def test_repack_left_moves_aligned_tensors_with_the_ids():
    from paperflow.core.lm.sampling import repack_left

    ids = torch.tensor([[5, 6, 0, 7, 0], [0, 8, 9, 0, 4]])
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 0, 1]])
    resp = torch.tensor([[0, 1, 0, 1, 0], [0, 0, 1, 0, 1]])
    reward = torch.tensor([[0.0, 0.5, 9.0, 0.25, 9.0], [9.0, 0.0, 1.0, 9.0, 2.0]])
    new_ids, new_mask, new_resp, new_reward = repack_left(ids, mask, 0, resp, reward)
    assert new_ids.tolist() == [[5, 6, 7], [8, 9, 4]] and new_mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert new_resp.tolist() == [[0, 1, 1], [0, 1, 1]] and new_reward.tolist() == [[0.0, 0.5, 0.25], [0.0, 1.0, 2.0]]
    short = repack_left(ids[:, :3], torch.tensor([[1, 0, 0], [0, 1, 1]]), 0, resp[:, :3])
    assert short[2].tolist() == [[0, 0], [0, 1]]  # zero on the padding
    with pytest.raises(ValueError, match="aligned tensor"):
        repack_left(ids, mask, 0, resp[:, :2])


def test_sample_with_embeds_banned_ids_and_top_k():
    """The first forward may take embeddings (here: the ids' own embeddings, which must change nothing); banned ids
    are never drawn; top-k keeps k tokens and the recorded log-prob is the truncated law's."""
    from paperflow.core.lm.models import build_model
    from paperflow.core.lm.sampling import sample, sequence_logprobs

    spec = {
        "arch": "llama",
        "vocab_size": 24,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
    }
    model = build_model(spec, seed=0).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7], [0, 8, 9, 10, 11]])
    mask = (ids != 0).long()
    kw = dict(max_new_tokens=6, temperature=1.0, eos_token_id=None, pad_token_id=0)
    plain = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), **kw)
    embeds = model.get_input_embeddings()(ids)
    via = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), inputs_embeds=embeds, **kw)
    assert torch.equal(plain.completion_ids, via.completion_ids)
    torch.testing.assert_close(plain.logprobs, via.logprobs)
    banned = list(range(1, 20))
    r = sample(model, ids, mask, generator=torch.Generator().manual_seed(3), banned_token_ids=banned, **kw)
    assert not torch.isin(r.completion_ids, torch.tensor(banned)).any()
    r = sample(model, ids, mask, generator=torch.Generator().manual_seed(4), top_k=2, **{**kw, "max_new_tokens": 1})
    full = sequence_logprobs(model, r.sequences, r.attention_mask)[:, -1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -1]
    top2 = torch.log_softmax(torch.topk(logits, 2).values, -1)
    chosen = torch.topk(logits, 2).indices
    assert all(r.completion_ids[i, 0] in chosen[i] for i in range(2))
    for i in range(2):
        k = (chosen[i] == r.completion_ids[i, 0]).nonzero().item()
        assert r.logprobs[i, 0] == pytest.approx(float(top2[i, k]), abs=1e-5)
        assert r.logprobs[i, 0] > full[i]  # the truncated law gives its tokens more mass
    assert torch.isfinite(r.entropies).all()


@pytest.mark.parametrize("arch", list(SPECS))
def test_masked_forward_with_a_causal_pattern_is_the_plain_forward_and_returns_layer_features(arch):
    model = _model(arch)
    batch = _prompts()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    n, length = ids.shape
    pos = position_ids_from_mask(mask)
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
    allowed = causal & mask.bool()[:, None, :] | torch.eye(length, dtype=torch.bool)
    out = masked_forward(model, allowed, pos, input_ids=ids, layers=(1, 0))
    ref = model(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
    real = mask.bool()
    assert torch.allclose(out.logits[real], ref.logits[real], atol=1e-5)
    assert out.features.shape == (n, length, 2 * BASE["hidden_size"])
    h = BASE["hidden_size"]
    assert torch.allclose(out.features[..., :h][real], ref.hidden_states[1][real], atol=1e-5)
    assert torch.equal(out.features[..., h:], model.get_input_embeddings()(ids))


def test_masked_forward_verifies_a_token_tree_like_each_path_alone():
    """A tree of 5 nodes after a shared prefix (node i's parent in `parent`) in one pass: every node's logits equal
    those of its root-to-node path fed as a plain sequence; nodes on other branches are invisible to it."""
    model = _model()
    prefix = torch.tensor([[1, 4, 9, 7, 5]])
    nodes = torch.tensor([6, 8, 10, 11, 12])
    parent = [-1, -1, 0, 0, 2]  # two children of the root; node 2 and 3 under node 0; node 4 under node 2
    p, t = prefix.shape[1], len(nodes)
    anc = torch.eye(t, dtype=torch.bool)
    depth = [0] * t
    for i, par in enumerate(parent):
        j = par
        depth[i] = 1 if par < 0 else depth[par] + 1
        while j >= 0:
            anc[i, j] = True
            j = parent[j]
    allowed = torch.zeros(p + t, p + t, dtype=torch.bool)
    allowed[:p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
    allowed[p:, :p] = True
    allowed[p:, p:] = anc
    pos = torch.tensor([*range(p), *(p - 1 + d for d in depth)])
    out = masked_forward(model, allowed[None], pos[None], input_ids=torch.cat([prefix[0], nodes])[None])
    for i in range(t):
        path, j = [], i
        while j >= 0:
            path.insert(0, int(nodes[j]))
            j = parent[j]
        seq = torch.cat([prefix[0], torch.tensor(path)])[None]
        ref = model(input_ids=seq).logits[0, -1]
        assert torch.allclose(out.logits[0, p + i], ref, atol=1e-5), i


def test_masked_forward_checks_its_arguments():
    model = _model()
    ids = torch.tensor([[1, 4, 5]])
    pos = torch.arange(3)[None]
    ok = torch.tril(torch.ones(1, 3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="exactly one of"):
        masked_forward(model, ok, pos)
    with pytest.raises(ValueError, match="bool tensor of shape"):
        masked_forward(model, ok.float(), pos, input_ids=ids)
    with pytest.raises(ValueError, match="position_ids must have shape"):
        masked_forward(model, ok, pos[:, :2], input_ids=ids)
    with pytest.raises(ValueError, match="attend to itself"):
        masked_forward(model, ok & ~torch.eye(3, dtype=torch.bool), pos, input_ids=ids)
    with pytest.raises(ValueError, match=r"layers \[2\] out of range"):
        masked_forward(model, ok, pos, input_ids=ids, layers=(2,))
