"""The self-play policy's offline DPO at paper scale (spec 2.5) with TRL's DPOTrainer, on one process or on every GPU
of a node (torchrun + FSDP, as `paperflow.promptscale.sft`):

    run_dpo(policy_folder, pairs_jsonl, out_folder, settings, device="cuda", n_procs=8, history=...)

A pair's prompt is the benchmark user message of its problem rendered by the policy's chat template with the
generation prompt (the text vLLM's /v1/chat/completions put before the rollout), chosen and rejected the rollouts'
texts: TRL's standard (not conversational) format, so the tokens trained on are the tokens sampled; TRL appends EOS
to each completion. The reference is TRL's: with `ref_model=None` DPOTrainer loads a frozen copy of the policy from
its folder. The policy is trained in float32 with bf16 autocast (`bf16`) and saved with its tokenizer as a Hub-style
folder that the evaluate rule serves with vLLM.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paperflow.core.config import reject_unknown, require_keys
from paperflow.promptscale.sft import finish_training, run_ranks

REQUIRED = ("beta", "learning_rate", "per_device_train_batch_size", "max_length", "seed")
OPTIONAL = (
    "loss_type",
    "num_train_epochs",
    "max_steps",
    "gradient_accumulation_steps",
    "warmup_steps",
    "weight_decay",
    "lr_scheduler_type",
    "max_grad_norm",
    "bf16",
    "gradient_checkpointing",
    "fsdp",
    "logging_steps",
    "truncation_mode",
)


def check_settings(settings: Mapping[str, Any], where: str = "dpo") -> dict[str, Any]:
    """The config's `dpo` block: the keys DPOConfig needs here, nothing it would silently ignore."""
    require_keys(settings, REQUIRED, where)
    reject_unknown(settings, (*REQUIRED, *OPTIONAL), where)
    return dict(settings)


def dpo_arguments(settings: Mapping[str, Any], out_dir: str | Path, device: str, world_size: int) -> dict[str, Any]:
    """DPOConfig's arguments: the config's, plus what decides no result (no checkpoints or reporting, a log row per
    `logging_steps`), the CPU when `device` is cpu, and FSDP only on several ranks."""
    args = check_settings(settings)
    fsdp = args.pop("fsdp", None)
    if isinstance(args.get("loss_type"), str):
        args["loss_type"] = [args["loss_type"]]  # TRL 1.16 takes a list of losses
    base = {
        "output_dir": str(out_dir),
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": not sys.stderr.isatty(),
        "dataloader_num_workers": 0,
        "use_cpu": device == "cpu",
    }
    if fsdp and world_size > 1:
        base["fsdp"] = fsdp
    return {**base, **args}


def chat_prompt(tok, problem: str, message: str | None = None) -> str:
    """The prompt text of a self-play problem: the benchmark user message (or the pair's own `message`, as a code
    pair carries it) through the tokenizer's chat template, generation prompt added (what the rollouts were sampled
    after)."""
    from paperflow.promptscale.llm_text import eval_prompt

    if not getattr(tok, "chat_template", None):
        raise ValueError("the policy's tokenizer has no chat template: the rollouts were chat completions")
    return tok.apply_chat_template(
        [{"role": "user", "content": eval_prompt(problem) if message is None else message}],
        tokenize=False,
        add_generation_prompt=True,
    )


def train(
    model_folder: str,
    pairs: str,
    out_folder: str,
    settings: Mapping[str, Any],
    device: str,
    history: str | None = None,
    checkpoint_dir: str | None = None,
) -> list[dict[str, Any]]:
    """One rank of the DPO run: the policy and its tokenizer at `model_folder` (offline), the {"problem", "chosen",
    "rejected"} rows of `pairs` (JSONL), TRL's DPOTrainer with its own reference copy; rank 0 saves the model and
    tokenizer in `out_folder` and the logged rows in `history` (JSON). Returns the logged rows. With
    `checkpoint_dir` (the job's checkpoint folder) TRL saves there at least every 30 minutes and a rerun resumes
    (paperflow.promptscale.sft.finish_training)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from paperflow.core.device import pick
    from paperflow.promptscale.llm_text import read_jsonl

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        pick(device, key="models.policy.device")  # a GPU job that sees none fails here, naming the key
    rows = read_jsonl(pairs)
    if not rows:
        raise ValueError(f"{pairs}: no DPO pair")
    tok = AutoTokenizer.from_pretrained(model_folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_folder, local_files_only=True, dtype=torch.float32)
    data = [
        {"prompt": chat_prompt(tok, r["problem"], r.get("message")), "chosen": r["chosen"], "rejected": r["rejected"]}
        for r in rows
    ]
    trainer = DPOTrainer(
        model=model,
        ref_model=None,
        args=DPOConfig(**dpo_arguments(settings, checkpoint_dir or f"{out_folder}.trl", device, world_size)),
        train_dataset=Dataset.from_list(data),
        processing_class=tok,
    )
    return finish_training(trainer, tok, out_folder, history, resumable=checkpoint_dir is not None)


def run_dpo(
    model_folder: str,
    pairs: str,
    out_folder: str,
    settings: Mapping[str, Any],
    device: str,
    n_procs: int,
    history: str,
    checkpoint_dir: str | None = None,
) -> list[dict[str, Any]]:
    """`train` in this process (`n_procs` <= 1) or on `n_procs` ranks started by torchrun; the logged rows."""
    check_settings(settings)
    kwargs = {
        "model_folder": str(model_folder),
        "pairs": str(pairs),
        "out_folder": str(out_folder),
        "settings": dict(settings),
        "device": device,
        "history": str(history),
        "checkpoint_dir": None if checkpoint_dir is None else str(checkpoint_dir),
    }
    return run_ranks(train, __name__, kwargs, n_procs)


def dpo_job(
    policy_json: str,
    pairs: str,
    settings: Mapping[str, Any],
    device: str,
    n_procs: int,
    out_json: str,
    history: str,
    checkpoint_dir: str | None = None,
) -> dict[str, Any]:
    """The dpo rule: `run_dpo` from the policy its download JSON names into the folder beside `out_json`
    (models/selfplay/ for models/selfplay.json), and `out_json` naming that folder and its files. `checkpoint_dir`:
    the job's checkpoint folder (TRL's checkpoints, resumed from on a rerun)."""
    from paperflow.promptscale.llm_text import loss_summary, model_folder, write_model_json

    folder = Path(out_json).with_suffix("")
    logged = run_dpo(model_folder(policy_json), pairs, str(folder), settings, device, n_procs, history, checkpoint_dir)
    write_model_json(out_json, "selfplay", folder)
    return loss_summary("selfplay", logged)


if __name__ == "__main__":
    train(**json.loads(Path(sys.argv[1]).read_text()))
