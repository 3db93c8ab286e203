"""TRL as the anchor: its GRPOTrainer and DPOTrainer run on the same task, model and tokenizer as a paper's own
loop, on CPU at tiny/smoke scale, so a report can put the implementation users run beside ours.

Every setting that decides a result is named in `settings` (nothing is left to TRL's defaults silently):

    history = run_trl_grpo(model, tok, prompts, reward_fn, settings, out_dir)   # one row per logged step
    history = run_trl_dpo(model, ref_model, tok, pairs, settings, out_dir)

Prompts are plain text in the tokenizer's words (TRL tokenizes them; a word-level tokenizer must have no
chat template for that, or TRL would treat the prompts as conversations). `reward_fn(prompts, completions)`
gets the decoded texts and returns one float per completion.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.config import reject_unknown, require_keys

GRPO_KEYS = (
    "num_generations",
    "max_completion_length",
    "per_device_train_batch_size",
    "learning_rate",
    "max_steps",
    "temperature",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "scale_rewards",
    "seed",
)
DPO_KEYS = ("beta", "learning_rate", "max_steps", "per_device_train_batch_size", "seed")


def _common(out_dir: str | Path) -> dict[str, Any]:
    return {
        "output_dir": str(out_dir),
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def _history(trainer) -> pd.DataFrame:
    rows = [r for r in trainer.state.log_history if "step" in r and "train_runtime" not in r]
    return pd.DataFrame(rows)


def run_trl_grpo(
    model,
    tokenizer,
    prompts: Sequence[str],
    reward_fn: Callable[[list[str], list[str]], list[float]],
    settings: Mapping[str, Any],
    out_dir: str | Path,
) -> pd.DataFrame:
    """TRL's GRPOTrainer on `prompts` with `reward_fn`; returns its logged metrics per step (loss, reward,
    reward_std, entropy, clip ratios, ...). The model is trained in place."""
    require_keys(settings, GRPO_KEYS, "TRL GRPO settings")
    reject_unknown(settings, GRPO_KEYS, "TRL GRPO settings")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    def reward(prompts, completions, **_):
        return [float(r) for r in reward_fn(list(prompts), list(completions))]

    reward.__name__ = "task_reward"
    args = GRPOConfig(**_common(out_dir), **dict(settings))
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tokenizer,
    )
    trainer.train()
    return _history(trainer)


def run_trl_dpo(
    model,
    ref_model,
    tokenizer,
    pairs: Sequence[Mapping[str, str]],
    settings: Mapping[str, Any],
    out_dir: str | Path,
) -> pd.DataFrame:
    """TRL's DPOTrainer (sigmoid loss) on {"prompt", "chosen", "rejected"} texts; `ref_model` None takes a frozen
    copy of the initial model as the reference (TRL itself would reload it by name from the Hub, which a model
    built from a config does not have). Returns its logged metrics per step (loss, rewards/chosen,
    rewards/rejected, rewards/margins, rewards/accuracies, ...)."""
    require_keys(settings, DPO_KEYS, "TRL DPO settings")
    reject_unknown(settings, DPO_KEYS, "TRL DPO settings")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    for i, pair in enumerate(pairs):
        if set(pair) != {"prompt", "chosen", "rejected"}:
            raise ValueError(f"DPO pair {i} has keys {sorted(pair)}; need exactly prompt, chosen, rejected")
    args = DPOConfig(**_common(out_dir), **dict(settings))
    trainer = DPOTrainer(
        model=model,
        ref_model=ref_model if ref_model is not None else copy.deepcopy(model).eval(),
        args=args,
        train_dataset=Dataset.from_list([dict(p) for p in pairs]),
        processing_class=tokenizer,
    )
    trainer.train()
    return _history(trainer)
