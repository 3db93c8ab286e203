"""TRL as the anchor: its GRPOTrainer and DPOTrainer run on the same task, model and tokenizer as a paper's own
loop, on CPU at tiny/smoke scale, so a report can put the implementation users run beside ours.

    history = run_trl_grpo(model, tok, prompts, reward_fn, settings, out_dir)   # one row per logged step
    history = run_trl_dpo(model, ref_model, tok, pairs, settings, out_dir)

Every setting that decides a result is named in `settings` (GRPO_REQUIRED / DPO_REQUIRED); a few more may be
given (GRPO_OPTIONAL / DPO_OPTIONAL, TRL's defaults otherwise); any other key is refused. TRL defaults that
differ from a hand-written loop are required for that reason: bf16 mixed precision (TRL 1.16 turns it on by
default, on CPU too: log-probs then differ from float32 ones by ~1e-3), the linear learning-rate decay
(`lr_scheduler_type`), weight decay 0 (torch's AdamW has 0.01), gradient clipping at 1 (`max_grad_norm`), and,
when beta != 0, GRPO's ratio-weighted KL (`use_bias_correction_kl`, True in TRL 1.16).

What TRL needs from a word-level tokenizer and a model built from a config, handled here:
- Plain-text prompts are tokenized by `tokenizer(text)` (no special tokens are added by the kit's tokenizers), so
  a GRPO prompt carries its own "<bos>". TRL treats a prompt as a conversation only when it is a list of
  messages, so a tokenizer's chat template is never used for these plain-text prompts.
- TRL decodes GRPO completions with skip_special_tokens=True, which drops the EOS that `DigitWorld.reward`
  checks; `reward_fn` is given the completion words decoded from TRL's completion ids instead (`decode_words`:
  EOS kept, padding dropped).
- DPOTrainer joins prompt and completion by string concatenation ("... =" + "1 3" -> "... =1 3", one unknown
  word under a whitespace split); the texts are joined here with a space, and EOS appended to each completion.
- With beta != 0 GRPOTrainer reloads the reference model by the model's `_name_or_path`, which a model built from
  a config lacks: the initial weights are saved under out_dir/reference and the reference loaded from there.
  DPO's `ref_model=None` takes a frozen copy of the initial model (TRL itself would reload by name as well).
- Gradient checkpointing (on by default in TRL 1.16) is switched off: it changes no number and slows CPU runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.config import ConfigError, reject_unknown, require_keys
from paperflow.core.lm.tokenizer import decode_words

GRPO_REQUIRED = (
    "num_generations",
    "max_completion_length",
    "per_device_train_batch_size",
    "learning_rate",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "max_steps",
    "temperature",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "scale_rewards",
    "bf16",
    "seed",
)
GRPO_OPTIONAL = (
    "use_bias_correction_kl",  # required when beta != 0
    "gradient_accumulation_steps",
    "steps_per_generation",
    "num_iterations",
    "top_p",
    "top_k",
    "warmup_steps",
    "mask_truncated_completions",
    "importance_sampling_level",
    "logging_steps",
)
DPO_REQUIRED = (
    "beta",
    "loss_type",
    "learning_rate",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "max_steps",
    "per_device_train_batch_size",
    "bf16",
    "seed",
)
DPO_OPTIONAL = ("gradient_accumulation_steps", "warmup_steps", "label_smoothing", "max_length", "logging_steps")
PAIR_KEYS = ("prompt", "chosen", "rejected")


def _check_settings(settings: Mapping[str, Any], required, optional, where: str) -> dict[str, Any]:
    require_keys(settings, required, where)
    reject_unknown(settings, (*required, *optional), where)
    return dict(settings)


def training_args(out_dir: str | Path, use_cpu: bool = True) -> dict[str, Any]:
    """The TrainingArguments that decide no result: the device, no reporting or checkpoints, a log row per step
    (every TRL trainer the papers build on a small model takes these)."""
    return {
        "output_dir": str(out_dir),
        "use_cpu": bool(use_cpu),
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": False,
    }


def _check_words(tokenizer, text: str, where: str) -> None:
    """Refuse text with a word outside the vocabulary (it would silently become the unknown token)."""
    vocab = tokenizer.get_vocab()
    missing = sorted({w for w in text.split() if w not in vocab})
    if missing:
        raise ValueError(f"{where}: words outside the tokenizer's vocabulary: {missing} (text {text!r})")


def history_frame(log_history: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The per-step rows of a trainer's `state.log_history` (the end-of-training summary row dropped)."""
    return pd.DataFrame([r for r in log_history if "step" in r and "train_runtime" not in r])


def trl_reward(reward_fn: Callable[[list[str], list[list[str]]], Sequence[float]], tokenizer) -> Callable:
    """A TRL reward function that calls `reward_fn(prompts, completion_words)` with the completion words decoded
    from TRL's completion ids (EOS kept, nothing after it), one float per completion."""

    def task_reward(prompts, completions, completion_ids, **_) -> list[float]:
        words = [decode_words(tokenizer, ids) for ids in completion_ids]
        out = [float(r) for r in reward_fn(list(prompts), words)]
        if len(out) != len(words):
            raise ValueError(f"reward_fn returned {len(out)} rewards for {len(words)} completions")
        return out

    return task_reward


def run_trl_grpo(
    model,
    tokenizer,
    prompts: Sequence[str],
    reward_fn: Callable[[list[str], list[list[str]]], Sequence[float]],
    settings: Mapping[str, Any],
    out_dir: str | Path,
) -> pd.DataFrame:
    """TRL's GRPOTrainer on the plain-text `prompts` (words of the tokenizer, "<bos>" included where wanted);
    `reward_fn(prompts, completion_words)` returns one float per completion. The model is trained in place.
    Returns TRL's logged metrics, one row per step: loss, reward, reward_std, frac_reward_zero_std, entropy,
    clip_ratio/*, completions/*, kl (beta != 0), learning_rate, grad_norm, ..."""
    args = _check_settings(settings, GRPO_REQUIRED, GRPO_OPTIONAL, "TRL GRPO settings")
    if args["beta"] != 0 and "use_bias_correction_kl" not in args:
        raise ConfigError(
            "TRL GRPO settings: beta != 0 needs use_bias_correction_kl (TRL 1.16 multiplies the KL term by the "
            "ratio by default; GRPO as published does not)"
        )
    if not prompts:
        raise ValueError("run_trl_grpo needs at least one prompt")
    for i, p in enumerate(prompts):
        _check_words(tokenizer, p, f"prompt {i}")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from paperflow.core.lm.models import save_model

    config = GRPOConfig(**{**training_args(out_dir), **args})
    saved_name = model.config._name_or_path
    if args["beta"] != 0:  # TRL builds the reference by reloading the policy from its name
        model.config._name_or_path = str(save_model(model, Path(out_dir) / "reference"))
    try:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=trl_reward(reward_fn, tokenizer),
            args=config,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tokenizer,
        )
    finally:
        model.config._name_or_path = saved_name
    trainer.train()
    return history_frame(trainer.state.log_history)


def dpo_texts(pair: Mapping[str, str], eos_token: str) -> dict[str, str]:
    """One pair as DPOTrainer should see it from a word-level tokenizer: the prompt ending in a space (TRL
    concatenates prompt and completion strings) and each completion ending in EOS."""

    def completion(text: str) -> str:
        words = text.split()
        return " ".join(words if words and words[-1] == eos_token else [*words, eos_token])

    return {
        "prompt": " ".join(pair["prompt"].split()) + " ",
        **{k: completion(pair[k]) for k in ("chosen", "rejected")},
    }


def run_trl_dpo(
    model,
    ref_model,
    tokenizer,
    pairs: Sequence[Mapping[str, str]],
    settings: Mapping[str, Any],
    out_dir: str | Path,
) -> pd.DataFrame:
    """TRL's DPOTrainer on {"prompt", "chosen", "rejected"} texts in the tokenizer's words (EOS is appended to each
    completion here). `ref_model` None takes a frozen copy of the initial model. The model is trained in place.
    Returns TRL's logged metrics, one row per step: loss, rewards/chosen, rewards/rejected, rewards/margins,
    rewards/accuracies, logps/chosen, logps/rejected, ..."""
    args = _check_settings(settings, DPO_REQUIRED, DPO_OPTIONAL, "TRL DPO settings")
    rows = []
    for i, pair in enumerate(pairs):
        if set(pair) != set(PAIR_KEYS):
            raise ValueError(f"DPO pair {i} has keys {sorted(pair)}; need exactly {', '.join(PAIR_KEYS)}")
        for key in PAIR_KEYS:
            _check_words(tokenizer, pair[key], f"DPO pair {i} {key}")
        rows.append(dpo_texts(pair, tokenizer.eos_token))
    if not rows:
        raise ValueError("run_trl_dpo needs at least one pair")
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    if isinstance(args["loss_type"], str):
        args["loss_type"] = [args["loss_type"]]
    trainer = DPOTrainer(
        model=model,
        ref_model=ref_model if ref_model is not None else copy.deepcopy(model).eval(),
        args=DPOConfig(**{**training_args(out_dir), **args}),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    return history_frame(trainer.state.log_history)
