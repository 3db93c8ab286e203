"""TRL's trainers run on the kit's task, model and tokenizer on CPU: GRPO on digit-world addition with the task's
exact reward (EOS included), a shaped GRPO run whose reward rises, DPO separating correct from wrong answers;
settings are checked by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paperflow.core.config import ConfigError
from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.trl_anchor import run_trl_dpo, run_trl_grpo, trl_reward

pytestmark = pytest.mark.xdist_group("trl_anchor")

ADD2 = DigitWorld.from_config({"addition": {"n_digits": 2}})
ADD1 = DigitWorld.from_config({"addition": {"n_digits": 1}})
SPEC = {
    "arch": "llama",
    "vocab_size": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}
GRPO = {
    "num_generations": 8,
    "max_completion_length": 4,
    "per_device_train_batch_size": 16,
    "learning_rate": 3e-3,
    "lr_scheduler_type": "constant",
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "max_steps": 4,
    "temperature": 1.0,
    "beta": 0.0,
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "bf16": False,
    "seed": 0,
}
DPO = {
    "beta": 0.1,
    "loss_type": "sigmoid",
    "learning_rate": 3e-3,
    "lr_scheduler_type": "constant",
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "max_steps": 12,
    "per_device_train_batch_size": 8,
    "bf16": False,
    "seed": 0,
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _prompt_text(ex) -> str:
    return " ".join(["<bos>", *ex.prompt])


def test_reward_adapter_hands_over_the_completion_words_with_eos():
    tok = ADD2.tokenizer()
    vocab = tok.get_vocab()
    seen = []

    def reward_fn(prompts, completions):
        seen.extend(completions)
        return [len(c) for c in completions]

    ids = [[vocab["1"], vocab["2"], tok.eos_token_id], [vocab["3"], tok.eos_token_id, vocab["4"]], [vocab["5"]]]
    out = trl_reward(reward_fn, tok)(prompts=["a", "b", "c"], completions=["1 2", "3", "5"], completion_ids=ids)
    assert seen == [["1", "2", "<eos>"], ["3", "<eos>"], ["5"]] and out == [3.0, 2.0, 1.0]
    with pytest.raises(ValueError, match="1 rewards for 3"):
        trl_reward(lambda p, c: [0.0], tok)(prompts=["a"] * 3, completions=[""] * 3, completion_ids=ids)


def test_grpo_trainer_runs_on_two_digit_addition_with_the_exact_reward(tmp_path):
    tok = ADD2.tokenizer()
    examples = {_prompt_text(ex): ex for ex in ADD2.sample("addition", 16, np.random.default_rng(0))}
    seen = []

    def exact_reward(prompts, completions):
        rewards = [ADD2.reward(examples[p], c) for p, c in zip(prompts, completions)]
        seen.extend(zip(prompts, completions, rewards))
        return rewards

    model = build_model(SPEC, seed=0)
    settings = dict(GRPO, beta=0.04, use_bias_correction_kl=False)  # the reference model is reloaded from disk
    history = run_trl_grpo(model, tok, list(examples), exact_reward, settings, tmp_path)
    assert len(history) == settings["max_steps"]
    for column in ("loss", "reward", "kl", "entropy", "grad_norm"):
        assert np.isfinite(history[column]).all(), column
    assert ((history["reward"] >= 0) & (history["reward"] <= 1)).all()
    assert history["learning_rate"].eq(settings["learning_rate"]).all()  # constant, as asked (TRL decays linearly)
    assert model.config._name_or_path == "" and (tmp_path / "reference" / "model.safetensors").is_file()
    assert len(seen) == settings["max_steps"] * settings["per_device_train_batch_size"]
    vocab = tok.get_vocab()
    assert all(w in vocab for _, words, _ in seen for w in words)
    assert any(words and words[-1] == "<eos>" for _, words, _ in seen)  # EOS reaches the reward, as it must
    for prompt, words, reward in seen:  # the task's reward, on what TRL sampled
        assert reward == float(tuple(words[:4]) == (*examples[prompt].answer, "<eos>"))


def _carry_digit_reward(prompts, completions):
    """A shaped reward the tiny model can learn in a few steps: the first answer word is the carry digit."""
    out = []
    for p, words in zip(prompts, completions):
        a, b = int(p.split()[1]), int(p.split()[3])
        out.append(float(bool(words) and words[0] == str((a + b) // 10)))
    return out


def test_grpo_trainer_raises_a_learnable_reward(tmp_path):
    tok = ADD1.tokenizer()
    prompts = [_prompt_text(ex) for ex in ADD1.sample("addition", 64, np.random.default_rng(0))]
    settings = dict(GRPO, max_completion_length=3, max_steps=30, learning_rate=1e-2)
    history = run_trl_grpo(build_model(SPEC, seed=0), tok, prompts, _carry_digit_reward, settings, tmp_path)
    assert len(history) == 30 and np.isfinite(history["loss"]).all()
    reward = history["reward"].to_numpy()
    assert reward[-10:].mean() > reward[:10].mean() + 0.1, reward


def _wrong(answer: tuple[str, ...], rng: np.random.Generator) -> tuple[str, ...]:
    """Another number of the same width: the sum plus a nonzero offset."""
    width = len(answer)
    value = (int("".join(answer)) + int(rng.integers(1, 10**width))) % 10**width
    return tuple(f"{value:0{width}d}")


def test_dpo_trainer_separates_correct_from_wrong_answers(tmp_path):
    tok = ADD2.tokenizer()
    rng = np.random.default_rng(1)
    pairs = [
        {"prompt": _prompt_text(ex), "chosen": " ".join(ex.answer), "rejected": " ".join(_wrong(ex.answer, rng))}
        for ex in ADD2.sample("addition", 32, np.random.default_rng(1))
    ]
    model = build_model(SPEC, seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    history = run_trl_dpo(model, None, tok, pairs, DPO, tmp_path)
    assert len(history) == DPO["max_steps"] and np.isfinite(history["loss"]).all()
    margins = history["rewards/margins"].to_numpy()
    gap = (history["logps/chosen"] - history["logps/rejected"]).to_numpy()
    assert margins[-4:].mean() > margins[:2].mean() and margins[-4:].mean() > 0, margins
    assert gap[-4:].mean() > gap[:2].mean(), gap
    assert history["loss"].iloc[0] == pytest.approx(np.log(2), abs=1e-4)  # step 1: policy = its frozen copy
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # trained in place


def test_settings_are_checked_by_name(tmp_path):
    tok = ADD2.tokenizer()
    with pytest.raises(ConfigError, match="learning_rat"):
        run_trl_grpo(None, tok, ["<bos> 1"], _carry_digit_reward, dict(GRPO, learning_rat=1e-3), tmp_path)
    for key in ("loss_type", "bf16", "lr_scheduler_type"):
        missing = {k: v for k, v in GRPO.items() if k != key}
        with pytest.raises(ConfigError, match=key):
            run_trl_grpo(None, tok, ["<bos> 1"], _carry_digit_reward, missing, tmp_path)
    with pytest.raises(ConfigError, match="use_bias_correction_kl"):
        run_trl_grpo(None, tok, ["<bos> 1"], _carry_digit_reward, dict(GRPO, beta=0.04), tmp_path)
    with pytest.raises(ValueError, match="outside the tokenizer's vocabulary"):
        run_trl_grpo(None, tok, ["<bos> 1 plus 2"], _carry_digit_reward, GRPO, tmp_path)
    with pytest.raises(ConfigError, match="max_steps"):
        run_trl_dpo(None, None, tok, [], {k: v for k, v in DPO.items() if k != "max_steps"}, tmp_path)
    with pytest.raises(ValueError, match="exactly prompt, chosen, rejected"):
        run_trl_dpo(None, None, tok, [{"prompt": "1", "chosen": "2"}], DPO, tmp_path)
    with pytest.raises(ValueError, match="outside"):
        run_trl_dpo(None, None, tok, [{"prompt": "1 =", "chosen": "2", "rejected": "two"}], DPO, tmp_path)
