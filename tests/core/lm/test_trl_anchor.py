"""TRL's trainers run on the kit's task, model and tokenizer on CPU: GRPO learns the addition task's answer
format from its reward, DPO separates chosen from rejected answers; settings are checked by name."""

from __future__ import annotations

import numpy as np
import pytest

from paperflow.core.config import ConfigError
from paperflow.core.lm.digitworld import DigitWorld
from paperflow.core.lm.models import build_model
from paperflow.core.lm.trl_anchor import run_trl_dpo, run_trl_grpo

pytestmark = pytest.mark.xdist_group("trl_anchor")

WORLD = DigitWorld.from_config({"addition": {"n_digits": 1}})
SPEC = {
    "arch": "qwen2",
    "vocab_size": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
}
GRPO = {
    "num_generations": 8,
    "max_completion_length": 3,
    "per_device_train_batch_size": 16,
    "learning_rate": 3e-3,
    "max_steps": 30,
    "temperature": 1.0,
    "beta": 0.0,
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "loss_type": "dapo",
    "scale_rewards": "group",
    "seed": 0,
}


def _first_digit_reward(prompts, completions):
    """A shaped reward the tiny model can learn in a few steps: the first answer digit (the carry) is right."""
    out = []
    for p, c in zip(prompts, completions):
        a, b = int(p.split()[1]), int(p.split()[3])
        words = c.split()
        out.append(float(bool(words) and words[0] == str((a + b) // 10)))
    return out


def test_grpo_trainer_runs_on_the_addition_task_and_its_reward_rises(tmp_path):
    tok = WORLD.tokenizer()
    prompts = [" ".join(["<bos>", *ex.prompt]) for ex in WORLD.sample("addition", 64, np.random.default_rng(0))]
    history = run_trl_grpo(build_model(SPEC, seed=0), tok, prompts, _first_digit_reward, GRPO, tmp_path)
    assert len(history) == GRPO["max_steps"] and np.isfinite(history["loss"]).all()
    reward = history["reward"].to_numpy()
    assert reward[-10:].mean() > reward[:10].mean() + 0.1, reward


def test_dpo_trainer_separates_chosen_from_rejected(tmp_path):
    tok = WORLD.tokenizer()
    pairs = [
        {"prompt": " ".join(ex.prompt), "chosen": " ".join(ex.answer), "rejected": " ".join(ex.answer[::-1])}
        for ex in WORLD.sample("addition", 32, np.random.default_rng(1))
        if ex.answer[::-1] != ex.answer
    ]
    settings = {"beta": 0.1, "learning_rate": 3e-3, "max_steps": 12, "per_device_train_batch_size": 8, "seed": 0}
    history = run_trl_dpo(build_model(SPEC, seed=1), None, tok, pairs, settings, tmp_path)
    margins = history["rewards/margins"].to_numpy()
    assert len(history) == 12 and np.isfinite(history["loss"]).all()
    assert margins[-4:].mean() > margins[:2].mean() and margins[-4:].mean() > 0, margins


def test_settings_are_checked_by_name(tmp_path):
    bad = dict(GRPO, learning_rat=1e-3)
    with pytest.raises(ConfigError, match="learning_rat"):
        run_trl_grpo(None, None, [], _first_digit_reward, bad, tmp_path)
    missing = {k: v for k, v in GRPO.items() if k != "loss_type"}
    with pytest.raises(ConfigError, match="loss_type"):
        run_trl_grpo(None, None, [], _first_digit_reward, missing, tmp_path)
    with pytest.raises(ValueError, match="exactly prompt, chosen, rejected"):
        run_trl_dpo(
            None,
            None,
            None,
            [{"prompt": "1", "chosen": "2"}],
            {"beta": 0.1, "learning_rate": 1e-3, "max_steps": 1, "per_device_train_batch_size": 1, "seed": 0},
            tmp_path,
        )
