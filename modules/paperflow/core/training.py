"""Lightning glue shared by the papers that train by gradient descent.

`make_trainer` builds a `pytorch_lightning.Trainer` from a paper's train config: seeded, CSV logging
always, a `WandbLogger` when enabled (offline unless the user asks otherwise; its run directory under
the job's own folder), `accelerator="auto"` with whatever devices the job was given, and a progress
bar only on a terminal. With `devices > 1` training is data-parallel (DDP): the job's process spawns
one worker per device on its node (gloo on CPU, NCCL on GPUs) and gets rank 0's weights back, so a
Snakemake script stays one process from Snakemake's and SLURM's point of view.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytorch_lightning as pl
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger
from pytorch_lightning.strategies import DDPStrategy

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> int:
    """Seed python, numpy and torch (and dataloader workers)."""
    return pl.seed_everything(seed, workers=True, verbose=False)


def make_loggers(run_dir: str | Path, name: str, wandb: Mapping[str, Any] | None, tags: dict[str, str]) -> list[Logger]:
    run_dir = Path(run_dir)
    shutil.rmtree(run_dir / "csv" / name, ignore_errors=True)  # a rerun must not append to old logs
    loggers: list[Logger] = [CSVLogger(save_dir=str(run_dir), name="csv", version=name)]
    if wandb is not None and wandb["enabled"]:  # None: no wandb (tests); else config.yaml's wandb block
        mode = wandb["mode"]
        os.environ["WANDB_MODE"] = mode
        loggers.append(
            WandbLogger(
                name=name,
                save_dir=str(run_dir),
                project=wandb["project"],
                offline=mode == "offline",
                group=tags.get("paper"),
                job_type=tags.get("rule"),
                tags=[v for v in tags.values() if v],
                log_model=False,
            )
        )
    return loggers


class SpawnDDPStrategy(DDPStrategy):
    """DDP over spawned workers, each destroying its process group when its fit ends (teardown), so that the
    backend's threads are joined before the worker exits; left to the interpreter's exit, a gloo worker can abort
    with "terminate called without an active exception" after training finished. Nothing collective runs in a
    worker after teardown (Lightning only collects rank 0's state dict), and the main process never joins a group."""

    def teardown(self) -> None:
        super().teardown()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def make_trainer(
    *,
    max_epochs: int,
    run_dir: str | Path,
    name: str,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    gradient_clip_val: float | None = None,
    deterministic: bool = True,
    devices: int = 1,
    **trainer_kwargs: Any,
) -> pl.Trainer:
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    strategy: Any = "auto"
    if devices > 1:
        # spawn: the script is not re-executed; LightningEnvironment: the workers are ours, not srun's
        strategy = SpawnDDPStrategy(start_method="spawn", cluster_environment=LightningEnvironment())
    return pl.Trainer(
        max_epochs=max_epochs,
        accelerator="auto",
        devices=devices,
        strategy=strategy,
        logger=make_loggers(run_dir, name, wandb, tags or {}),
        gradient_clip_val=gradient_clip_val,
        deterministic=deterministic,
        enable_checkpointing=False,
        enable_progress_bar=sys.stderr.isatty(),
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        log_every_n_steps=1,
        **trainer_kwargs,
    )


def epoch_history(trainer: pl.Trainer) -> pd.DataFrame:
    """The epoch-level metrics the CSV logger wrote (rank 0's file; also after a DDP run)."""
    csv = next(l for l in trainer.loggers if isinstance(l, CSVLogger))
    frame = pd.read_csv(Path(csv.log_dir) / "metrics.csv")
    frame = frame.dropna(axis=1, how="all").drop(columns=["step"], errors="ignore")
    frame.columns = [c.split("/", 1)[1] if "/" in c else c for c in frame.columns]
    return frame.groupby("epoch", as_index=False).first()


def tracking_ids(trainer: pl.Trainer) -> dict[str, Any]:
    """Run ids of the loggers, for the provenance record."""
    ids: dict[str, Any] = {}
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            exp = logger.experiment
            ids["wandb"] = {"id": exp.id, "offline": bool(exp.offline), "dir": str(exp.dir)}
        elif isinstance(logger, CSVLogger):
            ids["csv"] = logger.log_dir
    return ids
