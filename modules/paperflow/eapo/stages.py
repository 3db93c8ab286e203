"""EAPO's stages with their files, one function per rule (the scripts only pass paths and params). Every RL run (pi_E
and each arm) is TRL's GRPOTrainer with EAPO's rollout, built by `paperflow.eapo.paper_train.trainer` as at paper
scale, on the digit world's tiny model and tokenizer."""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from functools import partial
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


class MechanismCounts:
    """The digit world's observer of the TRL rollout (`paper_train.Rollout.observer`): counts over augmented rows'
    answer tokens, [position, injected?, pi_old's argmax != gold?, the prior's draw == gold?] (the prior's draw is
    the token injected where the step is injected). Gold answers are looked up by prompt ids."""

    def __init__(self, task: AdditionTask, examples: Sequence[Example]):
        batch = task.encode(list(examples))
        self.gold = {tuple(p.tolist()): a for p, a in zip(batch.prompt_ids, batch.answer_ids)}
        self.counts = np.zeros((len(ANSWER_POSITIONS), 2, 2, 2), dtype=np.int64)

    def __call__(self, prompt_ids: Sequence[Sequence[int]], flags, mask, augmented) -> None:
        import torch

        gold = torch.stack([self.gold[tuple(int(i) for i in p)] for p in prompt_ids])
        rows = augmented.cpu().bool()
        mask, flags = mask.cpu(), {k: v.cpu() for k, v in flags.items()}
        for t in range(min(mask.shape[1], gold.shape[1], self.counts.shape[0])):
            live = mask[rows, t].bool()
            inj = flags["inject"][rows, t][live].long().numpy()
            wrong = (flags["argmax"][rows, t] != gold[rows, t])[live].long().numpy()
            fixed = (flags["prior_token"][rows, t] == gold[rows, t])[live].long().numpy()
            np.add.at(self.counts[t], (inj, wrong, fixed), 1)


def learning_curves(evaluate, every: int, rollout, column: str = "test_accuracy", stop_above: float | None = None):
    """A TrainerCallback keeping one row per optimiser step: `evaluate()` (greedy accuracy) at step 0, every
    `every` steps and at the last step in `column`; TRL's logged reward, zero-variance share, loss and clip share;
    the rollout's statistics of that step's generation (`Rollout.stats`: entropy, tau, critical_rate,
    injection_rate). With `stop_above`, training stops at the first evaluation whose value exceeds it (the
    evaluated policy is the one kept). `frame()` returns the rows."""
    from transformers import TrainerCallback

    logged = {
        "reward": "reward",
        "frac_reward_zero_std": "zero_variance_groups",
        "loss": "loss",
        "clip_ratio/region_mean": "clip_fraction",
    }

    class Curves(TrainerCallback):
        def __init__(self):
            self.rows: dict[int, dict[str, float]] = {}

        def _evaluate(self, step: int, control) -> None:
            value = float(evaluate())
            self.rows.setdefault(step, {"step": step})[column] = value
            log.debug("step %d: %s %.3f", step, column, value)
            if stop_above is not None and value > stop_above:
                control.should_training_stop = True

        def on_train_begin(self, args, state, control, **kwargs):
            self._evaluate(0, control)
            return control

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if step % every == 0 or step >= state.max_steps:
                self._evaluate(step, control)
            return control

        def on_log(self, args, state, control, logs=None, **kwargs):
            row = self.rows.setdefault(state.global_step, {"step": state.global_step})
            row |= {ours: float(logs[theirs]) for theirs, ours in logged.items() if theirs in (logs or {})}
            return control

        def frame(self) -> list[dict[str, float]]:
            keys = ("entropy", "tau", "critical_rate", "injection_rate")
            for i, st in enumerate(rollout.stats):  # call i generated the batch of optimiser step i + 1
                self.rows.setdefault(i + 1, {"step": i + 1}).update({k: st[k] for k in keys})
            return [self.rows[k] for k in sorted(self.rows)]

    return Curves()


def _prompt(task: AdditionTask, example: Example) -> str:
    return " ".join([task.tokenizer.bos_token, *example.prompt])


def grpo_args(rl_cfg: Mapping[str, Any], task: AdditionTask, steps: int, seed: int, lr: float, out_dir: str):
    """GRPOConfig of one digit-world run: the method's settings from `rl` mapped as at paper scale
    (`paper.trl_settings`: G, clip range, temperature, epochs, grad clip, token-mean loss, beta 0, constant lr),
    one optimiser step per generation of rl.prompts_per_step x G rows, completions of the answer's length, float32
    on the CPU, no checkpoints."""
    from trl import GRPOConfig

    from paperflow.core.lm.trl_anchor import training_args
    from paperflow.eapo.paper import trl_settings

    rows = int(rl_cfg["prompts_per_step"]) * int(rl_cfg["group_size"])
    layout = {
        "per_device_train_batch_size": rows,
        "gradient_accumulation_steps": 1,
        "max_completion_length": task.answer_length,
        "lr_scheduler_type": "constant",
        "bf16": False,
    }
    cfg = {"rl": {**rl_cfg, "lr": lr}, "math": {"trl": layout}}
    return GRPOConfig(**training_args(out_dir), **trl_settings(cfg, processes=1, steps=steps, seed=seed))


def run_trl(
    policy,
    prior,
    method: str,
    params: Mapping[str, Any],
    task: AdditionTask,
    seed: int,
    evaluate,
    exclude: Sequence[Example],
    out_dir: str,
    steps: int | None = None,
    lr: float | None = None,
    column: str = "test_accuracy",
    stop_above: float | None = None,
):
    """One digit-world run of `method` with TRL's GRPOTrainer and EAPO's rollout (`paper_train.trainer`, the
    paper scale's code path): `steps` (default rl.steps) steps from `policy` (trained in place) on
    rl.prompts_per_step fresh problems a step (drawn with `seed`, none in `exclude`), pi_E `prior` injected as the
    method says. Returns the policy, its learning curve (`learning_curves`) and the mechanism counts."""
    from datasets import Dataset
    from transformers import PrinterCallback

    from paperflow.core.lm.trl_anchor import trl_reward
    from paperflow.eapo import paper_train

    rl_cfg = params["rl"]
    steps = int(rl_cfg["steps"] if steps is None else steps)
    m = rl.method(method)
    if m.inject and prior is None:
        raise ValueError(f"method {method!r} needs an experience prior")
    examples = task.world.sample(TASK, int(rl_cfg["prompts_per_step"]) * steps, np.random.default_rng(seed), exclude)
    by_prompt = {_prompt(task, e): e for e in examples}
    observer = MechanismCounts(task, examples) if m.inject else None
    rows = int(rl_cfg["prompts_per_step"]) * int(rl_cfg["group_size"])
    trainer = paper_train.trainer(
        method=method,
        eapo=params["eapo"],
        rollout={"batch_rows": rows, "stop_tokens": []},
        seed=seed,
        args=grpo_args(rl_cfg, task, steps, seed, float(rl_cfg["lr"] if lr is None else lr), out_dir),
        policy=policy.train(),
        prior=prior if m.inject else None,
        tokenizer=task.tokenizer,
        dataset=Dataset.from_list([{"prompt": _prompt(task, e)} for e in examples]),
        reward_funcs=trl_reward(
            lambda ps, ws: [task.world.reward(by_prompt[p], w) for p, w in zip(ps, ws)], task.tokenizer
        ),
        observer=observer,
    )
    trainer.remove_callback(PrinterCallback)  # TRL's per-step prints: the curve keeps what the report needs
    curves = learning_curves(evaluate, int(rl_cfg["eval_every"]), trainer.eapo_rollout, column, stop_above)
    trainer.add_callback(curves)
    trainer.train()
    counts = observer.counts if observer is not None else np.zeros((len(ANSWER_POSITIONS), 2, 2, 2), np.int64)
    return policy.eval(), curves.frame(), counts


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
    model its spec names (pi_E, or the base for the control), through TRL (`run_trl`): checkpoints per seed,
    curves and mechanism counts."""
    task = AdditionTask.from_config(task_cfg)
    test_ex = read_problems(problems)
    test = task.encode(test_ex)
    m = rl.method(method)
    models = {"base": base, "prior": prior}
    curves, mech = [], []
    for seed in seeds:
        seed_all(seed)
        policy = load_checkpoint(models[m.start])
        experience = load_checkpoint(models[m.prior]) if m.inject else None
        with tempfile.TemporaryDirectory() as tmp:
            policy, records, counts = run_trl(
                policy, experience, method, params, task, seed, partial(accuracy, policy, task, test), test_ex, tmp
            )
        save_checkpoint(policy, outputs[seed], checkpoint_spec(base))
        curves.append(curve_frame(records, method, seed))
        mech.append(mechanism_frame(counts, method, seed))
        log.info("%s seed %d: final greedy test accuracy %.3f", method, seed, records[-1]["test_accuracy"])
    return pd.concat(curves, ignore_index=True), pd.concat(mech, ignore_index=True)


def validation_problems(task: AdditionTask, prior: Mapping[str, Any], test_ex: Sequence[Example]) -> list[Example]:
    """pi_E's held-out set: `prior.validation_size` problems drawn with `prior.seed`, none of them a test problem."""
    rng = np.random.default_rng([int(prior["seed"]), 2])
    return list(task.world.sample(TASK, int(prior["validation_size"]), rng, exclude=test_ex))


def train_prior(task_cfg, problems: str, base: str, params: Mapping[str, Any], out: str) -> pd.DataFrame:
    """pi_E: GRPO from the base with `prior.seed` and `prior.lr` through the same TRL trainer (`run_trl`) until its
    greedy accuracy on a held-out validation set (`validation_problems`, kept out of its training stream) exceeds
    `prior.target_accuracy`, evaluated every `rl.eval_every` steps, at most `prior.steps` steps. Its curve holds
    the validation accuracy per evaluation (`validation_accuracy`) and its final greedy test accuracy
    (`test_accuracy`, last row)."""
    task = AdditionTask.from_config(task_cfg)
    test_ex = read_problems(problems)
    pcfg = params["prior"]
    val_ex = validation_problems(task, pcfg, test_ex)
    val = task.encode(val_ex)
    seed = int(pcfg["seed"])
    seed_all(seed)
    policy = load_checkpoint(base)
    with tempfile.TemporaryDirectory() as tmp:
        prior, records, _ = run_trl(
            policy,
            None,
            "grpo",
            params,
            task,
            seed,
            partial(accuracy, policy, task, val),
            [*test_ex, *val_ex],
            tmp,
            steps=int(pcfg["steps"]),
            lr=float(pcfg["lr"]),
            column="validation_accuracy",
            stop_above=float(pcfg["target_accuracy"]),
        )
    save_checkpoint(prior, out, checkpoint_spec(base))
    frame = curve_frame(records, "prior", seed)
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
