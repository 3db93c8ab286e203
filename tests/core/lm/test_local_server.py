"""The kit's local OpenAI-compatible server: a request's samples are the kit sampler's with the request's seed,
whatever shares its batch; greedy decoding equals transformers' generate; stop strings, EOS and max_tokens end a
choice as vLLM reports them; the chat endpoint applies the chat template; a body it cannot honour is refused with
one line naming the key."""

from __future__ import annotations

import pytest
import torch

from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.local_server import LocalServer
from paperflow.core.lm.models import build_model
from paperflow.core.lm.sampling import RowStreams, sample
from paperflow.core.lm.serve import ServerError
from paperflow.core.lm.tokenizer import SIMPLE_CHAT_TEMPLATE, encode_words

WORLD = DigitWorld.from_config({"sorting": {"min_len": 2, "max_len": 7}})
TOK = WORLD.tokenizer()
SPEC = {
    "arch": "qwen2",
    "num_key_value_heads": 1,
    "vocab_size": len(TOK),
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
}
WORDS = [w for w in TOK.get_vocab() if w not in (TOK.bos_token, TOK.eos_token, TOK.pad_token, TOK.unk_token)]


@pytest.fixture(scope="module")
def model():
    return build_model(SPEC, seed=3).eval()


def prompts(count: int) -> list[tuple[str, ...]]:
    """Prompts of different lengths (so a shared batch pads them differently)."""
    return [tuple(WORDS[(3 * i + j) % len(WORDS)] for j in range(1 + i % 5)) for i in range(count)]


def text(words) -> str:
    return " ".join((TOK.bos_token, *words))


def direct(model, words, n: int, seed: int, max_tokens: int, temperature: float = 1.0) -> list[str]:
    """The kit sampler alone on n copies of one prompt with the request's generator."""
    enc = encode_words(TOK, [words] * n)
    out = sample(
        model,
        enc["input_ids"],
        enc["attention_mask"],
        max_new_tokens=max_tokens,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
        eos_token_id=TOK.eos_token_id,
        pad_token_id=TOK.pad_token_id,
    )
    rows = []
    for ids, mask in zip(out.completion_ids.tolist(), out.completion_mask.tolist()):
        kept = [t for t, m in zip(ids, mask) if m and t != TOK.eos_token_id]
        rows.append(TOK.decode(kept, skip_special_tokens=True))
    return rows


def test_a_requests_samples_are_the_kit_samplers_with_its_seed_whatever_shares_its_batch(model):
    items = prompts(24)
    with LocalServer(model, TOK, "m") as server:
        alone = [server.client().complete(text(p), n=4, max_tokens=9, seed=100 + i) for i, p in enumerate(items)]
        together = server.client(concurrency=24).map(
            lambda item: server.client().complete(text(item[1]), n=4, max_tokens=9, seed=100 + item[0]),
            list(enumerate(items)),
        )
        assert server.batches < 2 * len(items), "concurrent requests were never batched together"
    for i, p in enumerate(items):
        expected = direct(model, p, 4, 100 + i, 9)
        assert [c["text"] for c in alone[i]] == expected
        assert [c["text"] for c in together[i]] == expected
    other = [c["text"] for c in alone[0]]
    assert other != [c["text"] for c in alone[1]]  # another seed or prompt, other samples


def test_greedy_equals_transformers_generate(model):
    items = prompts(6)
    with LocalServer(model, TOK, "m") as server:
        client = server.client()
        got = [client.complete(text(p), temperature=0.0, max_tokens=8, seed=0)[0] for p in items]
    for p, choice in zip(items, got):
        ids = encode_words(TOK, [p])["input_ids"]
        ref = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=TOK.pad_token_id
        )[0, ids.shape[1] :].tolist()
        if TOK.eos_token_id in ref:
            ref = ref[: ref.index(TOK.eos_token_id)]
            assert choice["finish_reason"] == "stop"
        else:
            assert choice["finish_reason"] == "length"
        assert choice["text"] == TOK.decode(ref, skip_special_tokens=True)


def test_stop_strings_cut_the_text_and_end_it_as_stop(model):
    with LocalServer(model, TOK, "m") as server:
        client = server.client()
        free = client.complete(text(prompts(3)[2]), max_tokens=12, seed=7, temperature=1.5)[0]
        words = free["text"].split()
        assert len(words) >= 3, free
        stop = words[2]
        cut = client.complete(text(prompts(3)[2]), max_tokens=12, seed=7, temperature=1.5, stop=[stop])[0]
    assert cut["text"] == free["text"][: free["text"].find(stop)]
    assert cut["finish_reason"] == "stop"


def test_the_chat_endpoint_applies_the_chat_template(model):
    tok = WORLD.tokenizer()
    tok.chat_template = SIMPLE_CHAT_TEMPLATE.replace("assistant", WORDS[0]).replace("{{ m['role'] }} ", "")
    messages = [{"role": "user", "content": " ".join(WORDS[1:4])}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with LocalServer(model, tok, "m") as server:
        chat = server.client().chat(messages, n=2, max_tokens=6, seed=5)
        plain = server.client().complete(list(ids), n=2, max_tokens=6, seed=5)
    assert [c["message"]["content"] for c in chat] == [c["text"] for c in plain]
    assert all(c["message"]["role"] == "assistant" for c in chat)


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"top_p": 0.9}, "top_p"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 100}, "max_tokens"),  # past max_model_len
        ({"seed": "x"}, "seed"),
    ],
)
def test_a_body_it_cannot_honour_is_refused_naming_the_key(model, params, key):
    with LocalServer(model, TOK, "m") as server:
        with pytest.raises(ServerError, match=rf"HTTP 400: .*\b{key}\b"):
            server.client().complete(text(prompts(1)[0]), **params)


def test_another_model_name_is_not_served(model):
    with LocalServer(model, TOK, "m") as server:
        client = server.client()
        client.model = "other"
        with pytest.raises(ServerError, match="HTTP 404.*'other' is not served"):
            client.complete(text(prompts(1)[0]))


def test_row_streams_draw_each_block_from_its_own_generator(model):
    enc = encode_words(TOK, [prompts(2)[1]] * 5)
    common = dict(max_new_tokens=6, temperature=1.0, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    one = sample(model, enc["input_ids"], enc["attention_mask"], generator=torch.Generator().manual_seed(4), **common)
    streams = RowStreams([(torch.Generator().manual_seed(4), 5)])
    same = sample(model, enc["input_ids"], enc["attention_mask"], generator=streams, **common)
    assert torch.equal(one.completion_ids, same.completion_ids)
    with pytest.raises(ValueError, match="covers 3 rows, the batch has 5"):
        sample(
            model,
            enc["input_ids"],
            enc["attention_mask"],
            generator=RowStreams([(torch.Generator().manual_seed(4), 3)]),
            **common,
        )
