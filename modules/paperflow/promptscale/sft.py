"""Supervised fine-tuning of q_phi and p_theta at paper scale with TRL's SFTTrainer (prompt-completion data, the
loss on the completion only), on one process or on every GPU of a node:

    run_sft(model_folder, data_jsonl, out_folder, settings, device="cuda", n_procs=8, history=...)

With `n_procs` > 1 it starts `python -m torch.distributed.run --standalone --nproc-per-node=N -m
paperflow.promptscale.sft <args.json>` (paperflow.core.launch), and each rank runs `train` below; TRL / accelerate
read the ranks torchrun sets, and `settings.fsdp` (e.g. "full_shard auto_wrap") shards the 7B model and its
optimiser state across the GPUs. One process (a single GPU, or the CPU in the tests) runs `train` in place, and
`fsdp` is then not passed (it needs a process group). The weights are trained in float32 with bf16 autocast
(`bf16`), and saved with the tokenizer by `save_model` as a Hub-style folder that vLLM and the next iteration load.

Long jobs resume: with `checkpoint_dir` (the rule's `job.checkpoint_dir()`) the trainer's output_dir is that folder,
and `finish_training` trains with `paperflow.core.lm.resume.train`: a checkpoint there at least every 30 minutes and a
rerun resumes from the newest complete one (weights, optimiser, scheduler, generators, data position). Without it
(smoke, cpu, tests) the trainer saves nothing, as before.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.core.config import reject_unknown, require_keys

log = logging.getLogger(__name__)

REQUIRED = ("learning_rate", "per_device_train_batch_size", "max_length", "seed")
OPTIONAL = (
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
)


def check_settings(settings: Mapping[str, Any], where: str = "sft") -> dict[str, Any]:
    """The config's `sft` block: the keys TRL needs here, nothing it would silently ignore."""
    require_keys(settings, REQUIRED, where)
    reject_unknown(settings, (*REQUIRED, *OPTIONAL), where)
    return dict(settings)


def sft_arguments(settings: Mapping[str, Any], out_dir: str | Path, device: str, world_size: int) -> dict[str, Any]:
    """SFTConfig's arguments: the config's, plus what decides no result (no checkpoints or reporting, a log row
    per `logging_steps`), the completion-only loss, the CPU when `device` is cpu, and FSDP only on several ranks."""
    args = check_settings(settings)
    fsdp = args.pop("fsdp", None)
    base = {
        "output_dir": str(out_dir),
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": not sys.stderr.isatty(),
        "dataloader_num_workers": 0,
        "completion_only_loss": True,
        "use_cpu": device == "cpu",
    }
    if fsdp and world_size > 1:
        base["fsdp"] = fsdp
    return {**base, **args}


def train(
    model_folder: str,
    data: str,
    out_folder: str,
    settings: Mapping[str, Any],
    device: str,
    history: str | None = None,
    checkpoint_dir: str | None = None,
) -> list[dict[str, Any]]:
    """One rank of the fine-tuning: the model and tokenizer at `model_folder` (offline), the {"prompt",
    "completion"} rows of `data` (JSONL, read by `datasets` as memory-mapped Arrow), TRL's SFTTrainer; rank 0 saves the model and tokenizer in `out_folder`
    and the logged rows in `history` (JSON). Returns the logged rows. `checkpoint_dir`: module docstring."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from paperflow.core.device import pick

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        pick(device, key="models.prompt.device")  # a GPU job that sees none fails here, naming the key
    with open(data, encoding="utf-8") as handle:
        if not any(line.strip() for line in handle):
            raise ValueError(f"{data}: no training rows")
    # memory-mapped Arrow, not a list in memory: the SFT arm's traces are millions of long rows
    rows = load_dataset("json", data_files=str(data), split="train", cache_dir=f"{out_folder}.trl/datasets")
    tok = AutoTokenizer.from_pretrained(model_folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_folder, local_files_only=True, dtype=torch.float32)
    trainer = sft_trainer(model, tok, rows, settings, checkpoint_dir or f"{out_folder}.trl", device, world_size)
    return finish_training(trainer, tok, out_folder, history, resumable=checkpoint_dir is not None)


def sft_trainer(model, tok, rows, settings: Mapping[str, Any], out_dir: str, device: str, world_size: int = 1):
    """TRL's SFTTrainer on a `datasets.Dataset` of {"prompt", "completion"} rows with `sft_arguments`: the one SFT
    trainer of every scale (paper scale's `train`, and `fit` for the tiny models of smoke and cpu)."""
    from trl import SFTConfig, SFTTrainer

    return SFTTrainer(
        model=model,
        args=SFTConfig(**sft_arguments(settings, out_dir, device, world_size)),
        train_dataset=rows.select_columns(["prompt", "completion"]),
        processing_class=tok,
    )


def fit(model, tok, rows: Sequence[Mapping[str, str]], settings: Mapping[str, Any], device: str = "cpu") -> list[dict]:
    """Fine-tune `model` in place with `sft_trainer` on in-memory {"prompt", "completion"} rows, on one process
    (the tiny q, p and solvers of smoke and cpu scale); the trainer's per-step logged rows."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar
    from transformers import PrinterCallback

    if not rows:
        raise ValueError("sft.fit: no training rows")
    disable_progress_bar()  # one bar per map and per fine-tuning would fill the job's log
    own = set(vars(model))
    with tempfile.TemporaryDirectory(prefix="paperflow-sft-") as out_dir:
        trainer = sft_trainer(model, tok, Dataset.from_list([dict(r) for r in rows]), settings, out_dir, device)
        trainer.remove_callback(PrinterCallback)  # a printed dict per step; the rows are returned instead
        trainer.train()
    # accelerate's prepare leaves a wrapped `forward` (and flags) on the instance; a deepcopy of the model would keep
    # calling the original's forward, so what it added is removed (tested)
    for name in set(vars(model)) - own:
        delattr(model, name)
    model.eval()
    return [dict(r) for r in trainer.state.log_history if "loss" in r and "train_runtime" not in r]


def finish_training(
    trainer, tok, out_folder: str, history: str | None, resumable: bool = False
) -> list[dict[str, Any]]:
    """Train a TRL trainer, save the model in `out_folder` (every rank: FSDP gathers the shards), and on rank 0 the
    tokenizer beside it and the logged rows in `history` (JSON). Returns the logged rows (SFT here, DPO in dpo.py).
    `resumable`: the trainer's output_dir is the job's checkpoint folder, and it trains with
    `paperflow.core.lm.resume.train` (timed checkpoints there, resuming from the newest complete one)."""
    if resumable:
        from paperflow.core.lm import resume

        resume.train(trainer)
    else:
        trainer.train()
    trainer.save_model(out_folder)
    logged = [dict(r) for r in trainer.state.log_history]
    if trainer.is_world_process_zero():
        tok.save_pretrained(out_folder)
        if history:
            Path(history).write_text(json.dumps(logged, indent=1) + "\n")
    return logged


def command(n_procs: int, args_file: str | Path, module: str = __name__) -> list[str]:
    """The command that runs `module`'s `train` on `n_procs` processes of this node (torchrun; plain python for
    one); the module reads its keyword arguments from `args_file` (JSON)."""
    from paperflow.core.launch import launch_command

    return [*launch_command(int(n_procs), python=sys.executable).split(), "-m", module, str(args_file)]


def run_ranks(train_fn, module: str, kwargs: Mapping[str, Any], n_procs: int) -> list[dict[str, Any]]:
    """`train_fn(**kwargs)` in this process (`n_procs` <= 1), or `module` on `n_procs` ranks started by torchrun
    with `kwargs` in a JSON file beside `kwargs["out_folder"]`; the logged rows (rank 0's `kwargs["history"]`)."""
    if int(n_procs) <= 1:
        return train_fn(**kwargs)
    parent = Path(kwargs["out_folder"]).parent
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=parent, delete=False) as fh:
        json.dump(dict(kwargs), fh)
    cmd = command(n_procs, fh.name, module)
    log.info("running %s", " ".join(cmd))
    try:
        subprocess.run(cmd, check=True)
    finally:
        Path(fh.name).unlink(missing_ok=True)
    return json.loads(Path(kwargs["history"]).read_text())


def run_sft(
    model_folder: str,
    data: str,
    out_folder: str,
    settings: Mapping[str, Any],
    device: str,
    n_procs: int,
    history: str,
    checkpoint_dir: str | None = None,
) -> list[dict[str, Any]]:
    """`train` in this process (`n_procs` <= 1) or on `n_procs` ranks started by torchrun; the logged rows.
    `checkpoint_dir`: module docstring."""
    check_settings(settings)
    kwargs = {
        "model_folder": str(model_folder),
        "data": str(data),
        "out_folder": str(out_folder),
        "settings": dict(settings),
        "device": device,
        "history": str(history),
        "checkpoint_dir": None if checkpoint_dir is None else str(checkpoint_dir),
    }
    return run_ranks(train, __name__, kwargs, n_procs)


if __name__ == "__main__":
    train(**json.loads(Path(sys.argv[1]).read_text()))
