"""EAPO's stages with their files, one function per rule (the scripts only pass paths and params)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.lm.digitworld import Example
from paperflow.core.lm.models import checkpoint_spec, load_checkpoint, save_checkpoint
from paperflow.core.seeding import seed_all
from paperflow.eapo import rl, sft
from paperflow.eapo.task import ANSWER_POSITIONS, TASK, AdditionTask, accuracy

log = logging.getLogger(__name__)


def read_problems(path: str) -> list[Example]:
    frame, _ = read_frame(path)
    return [Example(TASK, tuple(p.split()), tuple(a.split())) for p, a in zip(frame["prompt"], frame["answer"])]


def train_base(
    task_cfg, problems: str, vocabulary: str, model: Mapping[str, Any], settings: Mapping[str, Any], out: str
) -> pd.DataFrame:
    """The weak SFT base (one model, `settings.seed`): its checkpoint and its history. The vocabulary written by
    preprocess must be the tokenizer's, id for id (a stale file is refused)."""
    task = AdditionTask.from_config(task_cfg)
    words = json.loads(Path(vocabulary).read_text())
    if {w: i for i, w in enumerate(words)} != task.vocab:
        raise ValueError(f"{vocabulary}: the tokenizer's vocabulary differs from it; rerun preprocess")
    test_ex = read_problems(problems)
    spec = sft.model_spec(model, task)
    seed_all(int(settings["seed"]))
    base, rows = sft.train_base(task, spec, settings, int(settings["seed"]), test_ex, task.encode(test_ex))
    save_checkpoint(base, out, spec)
    return pd.DataFrame(rows)


def _settings(params: Mapping[str, Any]) -> rl.Settings:
    return rl.Settings.from_config(params["rl"], params["eapo"], params["luffy"], params["dapo"])


def curve_frame(records: Sequence[Mapping[str, float]], method: str, seed: int) -> pd.DataFrame:
    return pd.DataFrame(records).assign(method=method, seed=seed)


def mechanism_frame(counts: np.ndarray, method: str, seed: int) -> pd.DataFrame:
    """Long table of the counts over augmented answer tokens: position x injected x (pi_old's argmax wrong) x (the
    prior's draw at that step is the gold token)."""
    rows = [
        {
            "method": method,
            "seed": seed,
            "position": ANSWER_POSITIONS[p],
            "injected": bool(i),
            "wrong": bool(w),
            "prior_correct": bool(c),
            "count": int(counts[p, i, w, c]),
        }
        for p in range(counts.shape[0])
        for i in (0, 1)
        for w in (0, 1)
        for c in (0, 1)
    ]
    return pd.DataFrame(rows)


def train_method(
    method: str,
    task_cfg: Mapping[str, Any],
    problems: str,
    base: str,
    prior: str | None,
    params: Mapping[str, Any],
    seeds: Sequence[int],
    outputs: Mapping[int, str],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`method` for every seed from its starting model (the base, or pi_E for from_prior), with the experience
    model its spec names (pi_E, or the base for the control): checkpoints per seed, curves and mechanism counts."""
    task = AdditionTask.from_config(task_cfg)
    test_ex = read_problems(problems)
    test = task.encode(test_ex)
    s = _settings(params)
    m = rl.method(method)
    models = {"base": base, "prior": prior}
    curves, mech = [], []
    for seed in seeds:
        seed_all(seed)
        policy = load_checkpoint(models[m.start])
        experience = load_checkpoint(models[m.prior]) if (m.inject or m.luffy) else None
        policy, records, counts = rl.train(policy, experience, method, s, task, seed, test, test_ex)
        save_checkpoint(policy, outputs[seed], checkpoint_spec(base))
        curves.append(curve_frame(records, method, seed))
        mech.append(mechanism_frame(counts, method, seed))
        final = records[-1].get("test_accuracy")
        log.info("%s seed %d: final greedy test accuracy %.3f", method, seed, final)
    return pd.concat(curves, ignore_index=True), pd.concat(mech, ignore_index=True)


def validation_problems(task: AdditionTask, prior: Mapping[str, Any], test_ex: Sequence[Example]) -> list[Example]:
    """pi_E's held-out set: `prior.validation_size` problems drawn with `prior.seed`, none of them a test problem."""
    rng = np.random.default_rng([int(prior["seed"]), 2])
    return list(task.world.sample(TASK, int(prior["validation_size"]), rng, exclude=test_ex))


def train_prior(task_cfg, problems: str, base: str, params: Mapping[str, Any], out: str) -> pd.DataFrame:
    """pi_E: GRPO from the base with `prior.seed` (spec section 7, train_prior) until its greedy accuracy on a
    held-out validation set (`validation_problems`, kept out of its training stream) exceeds
    `prior.target_accuracy`, evaluated every `rl.eval_every` steps, at most `prior.steps` steps. Its curve holds
    the validation accuracy per evaluation (`validation_accuracy`) and its final greedy test accuracy
    (`test_accuracy`, last row)."""
    task = AdditionTask.from_config(task_cfg)
    test_ex = read_problems(problems)
    pcfg = params["prior"]
    val_ex = validation_problems(task, pcfg, test_ex)
    s = _settings(params)
    s.steps = int(pcfg["steps"])
    seed = int(pcfg["seed"])
    seed_all(seed)
    prior, records, _ = rl.train(
        load_checkpoint(base),
        None,
        "grpo",
        s,
        task,
        seed,
        task.encode(val_ex),
        [*test_ex, *val_ex],
        stop_above=float(pcfg["target_accuracy"]),
    )
    save_checkpoint(prior, out, checkpoint_spec(base))
    frame = curve_frame(records, "prior", seed).rename(columns={"test_accuracy": "validation_accuracy"})
    frame["test_accuracy"] = np.nan
    frame.loc[frame.index[-1], "test_accuracy"] = accuracy(prior, task, task.encode(test_ex))
    return frame


def evaluate(
    checkpoints: Mapping[tuple[str, int], str], task_cfg, problems: str, evaluation: Mapping[str, Any]
) -> pd.DataFrame:
    """Final test accuracy of every (method, seed) checkpoint, no injection: greedy (k = 1, T = 0) and avg@k at
    the sampling temperature (k = `samples`), spec section 8's smoke metrics."""
    task = AdditionTask.from_config(task_cfg)
    test = task.encode(read_problems(problems))
    rows = []
    for (method, seed), path in sorted(checkpoints.items()):
        model = load_checkpoint(path)
        rows.append(
            {
                "method": method,
                "seed": seed,
                "greedy_accuracy": accuracy(model, task, test),
                f"avg@{evaluation['samples']}": accuracy(
                    model,
                    task,
                    test,
                    float(evaluation["temperature"]),
                    int(evaluation["seed"]),
                    int(evaluation["samples"]),
                ),
            }
        )
    return pd.DataFrame(rows)


def trl_anchor(task_cfg, problems: str, base: str, params: Mapping[str, Any], anchor: Mapping[str, Any], out_dir: str):
    """TRL's GRPOTrainer from the same base on the same task and settings as our GRPO (report only, spec 11):
    TRL's logged history and the greedy test accuracy of its model at the end."""
    from paperflow.core.lm.trl_anchor import run_trl_grpo

    task = AdditionTask.from_config(task_cfg)
    test_ex = read_problems(problems)
    rl_cfg = params["rl"]
    steps, seed = int(anchor["steps"]), int(anchor["seed"])
    per_step = int(rl_cfg["prompts_per_step"])
    examples = task.world.sample(TASK, per_step * steps, np.random.default_rng(seed), exclude=test_ex)
    bos = task.tokenizer.bos_token
    prompts = [f"{bos} " + " ".join(e.prompt) for e in examples]
    by_prompt = {p: e for p, e in zip(prompts, examples)}

    def reward_fn(ps, words):
        return [task.world.reward(by_prompt[p], w) for p, w in zip(ps, words)]

    settings = {
        "num_generations": int(rl_cfg["group_size"]),
        "max_completion_length": task.answer_length,
        "per_device_train_batch_size": per_step * int(rl_cfg["group_size"]),
        "learning_rate": float(rl_cfg["lr"]),
        "lr_scheduler_type": "constant",
        "weight_decay": 0.0,
        "max_grad_norm": float(rl_cfg["grad_clip"]),
        "max_steps": steps,
        "temperature": float(rl_cfg["temperature"]),
        "beta": 0.0,
        "epsilon": float(rl_cfg["eps_low"]),
        "epsilon_high": float(rl_cfg["eps_high"]),
        "loss_type": "dapo",
        "scale_rewards": "group",
        "bf16": False,
        "seed": seed,
        "logging_steps": 1,
    }
    seed_all(seed)
    model = load_checkpoint(base).train()
    history = run_trl_grpo(model, task.tokenizer, prompts, reward_fn, settings, out_dir)
    acc = accuracy(model, task, task.encode(test_ex))
    return history, acc, settings
