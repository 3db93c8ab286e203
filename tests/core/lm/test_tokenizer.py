"""Word-level tokenizers: built with `tokenizers`, saved and loaded back through `AutoTokenizer` like a
published one, chat template included; the encoding helpers' padding and masks."""

from __future__ import annotations

import pytest
import torch

from paperflow.core.lm.tokenizer import (
    SIMPLE_CHAT_TEMPLATE,
    decode_words,
    encode_pairs,
    encode_words,
    load_tokenizer,
    save_tokenizer,
    vocabulary,
    word_level_tokenizer,
)

WORDS = ["user", "assistant", "0", "1", "2", "+", "="]


def test_specials_take_ids_0_to_3_and_words_follow_in_order():
    assert vocabulary(WORDS + ["1"]) == ["<pad>", "<bos>", "<eos>", "<unk>", *WORDS]
    tok = word_level_tokenizer(WORDS)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok("1 + 2 =").input_ids == [7, 9, 8, 10]  # no automatic BOS/EOS
    assert tok("1 7").input_ids == [7, 3]  # unknown word -> <unk>


@pytest.mark.parametrize("bad", ["two words", "", "<eos>"])
def test_bad_vocabulary_words_are_refused(bad):
    with pytest.raises(ValueError, match=repr(bad).strip("'")[:3] if bad else "empty"):
        vocabulary(["0", bad])


def test_autotokenizer_loads_the_saved_tokenizer_with_its_chat_template(tmp_path):
    tok = word_level_tokenizer(WORDS, chat_template=SIMPLE_CHAT_TEMPLATE)
    again = load_tokenizer(save_tokenizer(tok, tmp_path / "tok"))
    assert again.is_fast
    assert again.get_vocab() == tok.get_vocab()
    assert again.padding_side == "left"
    text = "<bos> 1 + 2 = 0 <eos>"
    assert again(text).input_ids == tok(text).input_ids
    assert again.decode(again(text).input_ids) == text
    chat = [{"role": "user", "content": "1 + 2 ="}]
    rendered = again.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert rendered == "user 1 + 2 = assistant"
    assert (
        again.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        == tok("user 1 + 2 = assistant").input_ids
    )
    batch = again(["1", "1 + 2"], padding=True, return_tensors="pt")
    assert batch.input_ids[0].tolist() == [0, 0, 7] and batch.attention_mask[0].tolist() == [0, 0, 1]


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_word_level_tokenizer_beside_a_model_config_loads_as_saved(tmp_path, model_type):
    """transformers maps some model types (qwen2 among them) to their own tokenizer class whatever
    tokenizer_config.json says; through AutoTokenizer the word-level vocabulary would be read with a byte-level
    BPE pre-tokenizer, which drops multi-character words. load_tokenizer must give back the saved tokenizer."""
    from transformers import AutoConfig

    AutoConfig.for_model(
        model_type, vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2
    ).save_pretrained(tmp_path)
    words = ["12", "+", "=", "hello,", "x"]
    tok = word_level_tokenizer(words)
    again = load_tokenizer(save_tokenizer(tok, tmp_path))
    text = "12 + 12 = hello, x"
    assert again(text).input_ids == tok(text).input_ids == [4, 5, 4, 6, 7, 8]
    assert again.decode(again(text).input_ids) == text
    assert again.padding_side == "left" and again.pad_token_id == 0


def test_encode_pairs_left_pads_and_masks_the_completion_with_its_eos():
    tok = word_level_tokenizer(WORDS)
    batch = encode_pairs(tok, [["1", "+", "2", "="], ["2", "="]], [["0"], ["1", "2"]])
    assert batch["input_ids"].tolist() == [[1, 7, 9, 8, 10, 6, 2], [0, 1, 8, 10, 7, 8, 2]]
    assert batch["attention_mask"].tolist() == [[1] * 7, [0, 1, 1, 1, 1, 1, 1]]
    assert batch["completion_mask"].tolist() == [[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1, 1]]
    assert decode_words(tok, batch["input_ids"][1]) == ["<bos>", "2", "=", "1", "2", "<eos>"]
    assert decode_words(tok, torch.tensor([7, 2, 8]), stop_at_eos=False) == ["1", "<eos>", "2"]


def test_words_outside_the_vocabulary_are_refused_by_the_encoder():
    tok = word_level_tokenizer(WORDS)
    with pytest.raises(ValueError, match=r"outside the vocabulary: \['7'\]"):
        encode_words(tok, [["1", "7"]])
