"""Digit world: each task's answer is the function of the prompt it claims to be, draws are reproducible
per generator, held-out sets stay out of the training stream, and the config refuses bad keys."""

from __future__ import annotations

import numpy as np
import pytest

from paperflow.core.config import ConfigError
from paperflow.core.lm.digitworld import DigitWorld

ALL = {
    "addition": {"n_digits": 2},
    "sorting": {"min_len": 8, "max_len": 12},
    "key_value": {"n_pairs": 6, "n_queries": 4},
    "counting": {"min_len": 5, "max_len": 9},
}


def _num(words) -> int:
    return int("".join(words))


def test_eapo_vocabulary_is_sixteen_tokens():
    tok = DigitWorld.from_config({"addition": {"n_digits": 2}}).tokenizer()
    assert len(tok) == 16


def test_answers_are_the_task_functions_of_their_prompts():
    world = DigitWorld.from_config(ALL)
    rng = np.random.default_rng(0)
    for ex in world.sample("addition", 200, rng):
        a, b = ex.prompt[:2], ex.prompt[3:5]
        assert ex.prompt[2] == "+" and ex.prompt[-1] == "=" and len(ex.answer) == 3
        assert _num(ex.answer) == _num(a) + _num(b)
    for ex in world.sample("sorting", 100, rng):
        digits = ex.prompt[1:-1]
        assert 8 <= len(digits) <= 12 and list(ex.answer) == sorted(digits)
    for ex in world.sample("key_value", 100, rng):
        body, asked = ex.prompt[: ex.prompt.index("order")], ex.prompt[ex.prompt.index("order") + 1 : -1]
        table = {body[i]: body[i + 2] for i in range(0, len(body), 4)}
        assert len(table) == 6 and len(asked) == len(set(asked)) == 4
        assert list(ex.answer) == [table[k] for k in asked]
    for ex in world.sample("counting", 100, rng):
        target, digits = ex.prompt[1], ex.prompt[3:-1]
        assert _num(ex.answer) == digits.count(target)


def test_one_vocabulary_covers_every_task_and_encodes_without_unknowns():
    world = DigitWorld.from_config(ALL)
    tok = world.tokenizer()
    rng = np.random.default_rng(1)
    for name in ALL:
        for ex in world.sample(name, 20, rng):
            assert tok.unk_token_id not in tok(" ".join(ex.prompt + ex.answer)).input_ids


def test_draws_follow_their_own_generator():
    world = DigitWorld.from_config(ALL)
    a = world.sample("sorting", 10, np.random.default_rng(7))
    b = world.sample("sorting", 10, np.random.default_rng(7))
    c = world.sample("sorting", 10, np.random.default_rng(8))
    assert a == b and a != c


def test_held_out_prompts_are_distinct_fixed_and_never_drawn_for_training():
    world = DigitWorld.from_config({"addition": {"n_digits": 1}})  # 100 prompts in all
    test = world.held_out("addition", 60, seed=12345)
    assert len({ex.prompt for ex in test}) == 60 and test == world.held_out("addition", 60, seed=12345)
    train = world.sample("addition", 2000, np.random.default_rng(0), exclude=test)
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in test}
    assert len({ex.prompt for ex in train}) == 40
    with pytest.raises(ValueError, match="fewer"):
        world.held_out("addition", 101, seed=0)


def test_reward_needs_the_exact_answer_closed_by_eos():
    world = DigitWorld.from_config({"addition": {"n_digits": 2}})
    ex = world.sample("addition", 1, np.random.default_rng(3))[0]
    good = [*ex.answer, "<eos>"]
    assert world.reward(ex, good) == 1.0
    assert world.reward(ex, [*good, "7", "7"]) == 1.0  # after EOS nothing counts
    assert world.reward(ex, list(ex.answer)) == 0.0  # not closed
    wrong = [str((int(ex.answer[0]) + 1) % 10), *ex.answer[1:], "<eos>"]
    assert world.reward(ex, wrong) == 0.0


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"addition": {"n_digit": 2}}, "n_digits"),
        ({"addition": {"n_digits": 2, "carry": True}}, "carry"),
        ({"sort": {"min_len": 1, "max_len": 2}}, "known: addition, sorting, key_value, counting"),
        ({"key_value": {"n_pairs": 3, "n_queries": 4}}, "n_queries <= n_pairs"),
        ({"sorting": {"min_len": 5, "max_len": 2}}, "min_len <= max_len"),
    ],
)
def test_bad_task_configs_are_named(cfg, message):
    with pytest.raises(ConfigError, match=message):
        DigitWorld.from_config(cfg)


def test_encoded_batches_reward_and_supervise_as_the_word_level_api():
    """`DigitWorld.encode`: left-padded prompts (sampler convention), answers + EOS right-padded; `rewards` equals
    `DigitWorld.reward` row by row on tasks of varying answer length; `sft` puts the completion mask on the answer."""
    import torch

    from paperflow.core.lm.tokenizer import encode_pairs

    world = DigitWorld.from_config({"sorting": {"min_len": 2, "max_len": 5}, "addition": {"n_digits": 2}})
    tok = world.tokenizer()
    rng = np.random.default_rng(0)
    examples = world.sample("sorting", 40, rng) + world.sample("addition", 10, rng)
    batch = world.encode(tok, examples)
    assert (batch.prompt_mask[:, -1] == 1).all() and (batch.prompt_mask[:, 0] == 0).any()
    assert batch.prompt_ids[batch.prompt_mask.bool()].eq(tok.bos_token_id).sum() == len(examples)
    inv = {i: w for w, i in tok.get_vocab().items()}
    comps = [batch.answer_ids.clone()]
    noisy = batch.answer_ids.clone()
    flip = torch.from_numpy(rng.random(noisy.shape) < 0.1)
    noisy[flip] = torch.from_numpy(rng.integers(4, len(inv), int(flip.sum())))
    comps += [noisy, batch.answer_ids[:, :2]]  # exact, perturbed, cut short
    for comp in comps:
        ours = batch.rewards(comp).tolist()
        theirs = [world.reward(ex, [inv[int(i)] for i in row]) for ex, row in zip(examples, comp)]
        assert ours == theirs
    assert sum(batch.rewards(comps[0])) == len(examples) and 0 < sum(batch.rewards(noisy)) < len(examples)
    sft = batch.sft()
    ref = encode_pairs(tok, [ex.prompt for ex in examples], [ex.answer for ex in examples])
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(sft[key], ref[key]), key
    rep = batch.repeat(3)
    assert torch.equal(rep.answer_ids[3:6], batch.answer_ids[1:2].expand(3, -1))
    assert torch.equal(batch.tile(2).prompt_ids[len(examples) :], batch.prompt_ids)
