"""Lightning glue shared by the papers that train by gradient descent.

`make_trainer` builds a `pytorch_lightning.Trainer` from a paper's train config: seeded, CSV logging
always, a `WandbLogger` when enabled (offline unless the user asks otherwise; its run directory under
the job's own folder), `accelerator="auto"` with whatever devices the job was given, and a progress
bar only on a terminal. With `devices > 1` training is data-parallel (DDP): the job's process spawns
one worker per device on its node (gloo on CPU, NCCL on GPUs) and gets rank 0's weights back, so a
Snakemake script stays one process from Snakemake's and SLURM's point of view.

A long job resumes: `make_trainer(..., checkpoint_dir=job.checkpoint_dir())` adds a `ResumeCheckpoint` that saves
`last.ckpt` there at least every 30 minutes, and `fit(trainer, module, datamodule)` resumes from it when it exists.
Saves fall on epoch ends where the epochs are short enough (the next save would come too late otherwise), and a
resumed run then equals an uninterrupted one bit for bit, its CSV log included: the checkpoint carries the random
number generators' states, and a copy of the CSV log is kept beside it. An epoch longer than the interval is saved mid-epoch; resuming there is exact only
for a dataloader with `state_dict`/`load_state_dict` (Lightning warns otherwise).
"""

from __future__ import annotations

import csv
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytorch_lightning as pl
import torch
from lightning_fabric import Fabric
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.loggers import CSVLogger, Logger, WandbLogger
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader

from paperflow.core.ranks import agree
from paperflow.core.resume import EVERY_S, Timer
from paperflow.core.seeding import rng_states, set_rng_states

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


class ResumeCheckpoint(Callback):
    """Saves the whole training state to `<folder>/last.ckpt` (written aside, then renamed: a kill mid-save keeps
    the previous one) at an epoch's end when the next epoch's end would come more than `every_s` seconds after the
    last save, and after a batch when `every_s` has passed (an epoch longer than that). The checkpoint also holds
    the random number generators' states (restored on load, before the next epoch draws its shuffle), which
    Lightning's own lacks. The CSV logger's file is copied beside it at every save and again at the next epoch's
    start (an epoch's row reaches the logger after its end's hooks); a resumed run starts its log with the copy's rows of the steps the
    checkpoint had done."""

    LAST = "last.ckpt"

    def __init__(
        self,
        folder: str | Path,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        at_end: bool = False,
    ):
        self.folder = Path(folder)
        self.at_end = at_end
        self.every_s = every_s
        self.clock = clock
        self.timer = Timer(every_s, clock)
        self._epoch_started = 0.0
        self._saved_at_epoch_end = False
        self._resumed = False

    @property
    def last(self) -> Path:
        return self.folder / self.LAST

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_rng_states(state_dict["rng"])
        self._resumed = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.timer = Timer(self.every_s, self.clock)
        self._restore_log(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_log(trainer)  # a fit restored at its end trains no step: on_train_start did not run

    def _restore_log(self, trainer: pl.Trainer) -> None:
        if self._resumed and trainer.is_global_zero:
            for logger in _csv_loggers(trainer):
                _restore_csv(logger, self._csv_copy(logger), trainer.global_step)
        self._resumed = False

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_started = self.timer.clock()
        if self._saved_at_epoch_end:  # that epoch's row is in the log now
            self._copy_csv(trainer)
            self._saved_at_epoch_end = False

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if agree(self.timer.due()):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch_s = self.timer.clock() - self._epoch_started
        if agree(self.timer.due(ahead_s=epoch_s)):
            self._save(trainer)
            self._saved_at_epoch_end = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.at_end:  # a job of several fits, rerun, skips the finished ones (each loads its last state)
            self._save(trainer)

    def _csv_copy(self, logger: CSVLogger) -> Path:
        return self.folder / "csv" / f"{logger.version}.csv"

    def _copy_csv(self, trainer: pl.Trainer) -> None:
        if not trainer.is_global_zero:
            return
        for logger in _csv_loggers(trainer):
            logger.save()
            source = Path(logger.experiment.metrics_file_path)
            if source.exists():
                copy = self._csv_copy(logger)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, copy.with_suffix(".tmp"))
                os.replace(copy.with_suffix(".tmp"), copy)

    def _save(self, trainer: pl.Trainer) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._copy_csv(trainer)
        tmp = self.folder / (self.LAST + ".tmp")
        trainer.save_checkpoint(tmp)
        if trainer.is_global_zero:
            os.replace(tmp, self.last)
        trainer.strategy.barrier("resume_checkpoint")
        self.timer.saved()
        log.info("checkpoint %s at epoch %d, step %d", self.last, trainer.current_epoch, trainer.global_step)


def _restore_csv(logger: CSVLogger, copy: Path, steps_done: int) -> None:
    """Start `logger`'s file with the rows of `copy` logged before step `steps_done`."""
    if not copy.exists():
        return
    with open(copy, newline="") as fh:
        reader = csv.DictReader(fh)
        keys = list(reader.fieldnames or [])
        rows = [row for row in reader if int(float(row["step"])) < steps_done]
    writer = logger.experiment
    with open(writer.metrics_file_path, "w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=keys)
        out.writeheader()
        out.writerows(rows)
    writer.metrics_keys = keys


def _csv_loggers(trainer: pl.Trainer) -> list[CSVLogger]:
    return [l for l in trainer.loggers if isinstance(l, CSVLogger)]


def fit(trainer: pl.Trainer, module: pl.LightningModule, datamodule: Any = None, **fit_kwargs: Any) -> None:
    """`trainer.fit`, resuming from the trainer's `ResumeCheckpoint` folder when a checkpoint is there."""
    resume = [c for c in trainer.callbacks if isinstance(c, ResumeCheckpoint)]
    ckpt_path = str(resume[0].last) if resume and resume[0].last.exists() else None
    if ckpt_path:
        log.info("resuming from %s", ckpt_path)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, **fit_kwargs)


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
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
    checkpoint_at_end: bool = False,
    **trainer_kwargs: Any,
) -> pl.Trainer:
    """A seeded Trainer (module docstring); with `checkpoint_dir`, one that saves there every `checkpoint_every_s`
    seconds at most, and at the fit's end with `checkpoint_at_end` (`ResumeCheckpoint`; train it with `fit` to
    resume)."""
    if devices < 1:
        raise ValueError(f"devices must be >= 1, got {devices}")
    strategy: Any = "auto"
    if devices > 1:
        # spawn: the script is not re-executed; LightningEnvironment: the workers are ours, not srun's
        strategy = SpawnDDPStrategy(start_method="spawn", cluster_environment=LightningEnvironment())
    if checkpoint_dir is not None:
        callbacks = list(trainer_kwargs.pop("callbacks", None) or [])
        trainer_kwargs["callbacks"] = [
            *callbacks,
            ResumeCheckpoint(checkpoint_dir, checkpoint_every_s, at_end=checkpoint_at_end),
        ]
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


class StepModule(pl.LightningModule):
    """A full-batch fit as a LightningModule: each epoch is one training step, `step(epoch) -> loss or (loss, logs)`
    (the closure `paperflow.core.loop.run_loop` steps in the plain engine), each log value logged once per epoch.
    `modules` are registered so that the Trainer moves them (trained and frozen ones) to its device, and
    `on_device(device)` moves whatever else the step reads (tensors held outside the modules) at fit start.
    `optimizers` is what `configure_optimizers` returns: the plain loop's optimizer, or a dict with its scheduler.
    `state` (an object with state_dict/load_state_dict) is what the step keeps outside the modules (its records, a
    best iterate): it is saved in the Trainer's checkpoints and restored from them, so a resumed fit has it too."""

    def __init__(
        self,
        step: Callable[[int], torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]],
        modules: list[nn.Module],
        optimizers: Any,
        on_device: Callable[[torch.device], None] | None = None,
        state: Any | None = None,
    ):
        super().__init__()
        self.fits = nn.ModuleList(modules)
        self.fit_step, self.fit_optimizers, self.on_device, self.fit_state = step, optimizers, on_device, state

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.fit_state is not None:
            checkpoint["fit_state"] = self.fit_state.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.fit_state is not None:
            self.fit_state.load_state_dict(checkpoint["fit_state"])

    def on_fit_start(self) -> None:
        if self.on_device is not None:
            self.on_device(self.device)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        out = self.fit_step(self.current_epoch)
        loss, logs = out if isinstance(out, tuple) else (out, {"loss": out.detach()})
        for key, value in logs.items():
            self.log(key, value, on_epoch=True, on_step=False, batch_size=1)
        return loss

    def configure_optimizers(self) -> Any:
        return self.fit_optimizers


def fit_steps(
    module: StepModule, epochs: int, checkpoint_dir: str | Path | None = None, **trainer_kwargs: Any
) -> pl.Trainer:
    """`epochs` steps of `module` under `make_trainer(max_epochs=epochs, **trainer_kwargs)` (deterministic="warn"
    unless given). The "dataset" is one dummy batch per epoch, drawn by its loader from its own generator, so the
    global torch stream (dropout, sampling inside the step) is the one the plain loop sees: on the CPU the two
    engines agree bit for bit. With `checkpoint_dir` (a folder of its own per fit, under the job's
    `checkpoint_dir()`), the fit saves there at epoch ends every 30 min at most and at its end, and resumes from
    there when rerun (one step per epoch: a resumed fit equals an uninterrupted one). Returns the fitted trainer
    (its CSV log: `epoch_history`; its ids: `tracking_ids`)."""
    trainer_kwargs.setdefault("deterministic", "warn")
    if checkpoint_dir is not None:
        trainer_kwargs.update(checkpoint_dir=checkpoint_dir, checkpoint_at_end=True)
    trainer = make_trainer(max_epochs=epochs, **trainer_kwargs)
    fit(trainer, module, train_dataloaders=DataLoader([0], batch_size=1, generator=torch.Generator().manual_seed(0)))
    return trainer


def make_fabric(
    loggers: list[Logger] | None = None, *, accelerator: str = "auto", precision: str = "32-true"
) -> Fabric:
    """The Fabric that drives a paper's own loop (federated rounds, penalty steps, sampler-driven DRO; CONVENTIONS
    section 6): one device of the job's (`auto`: a GPU where the job has one), `precision` as the plain loop
    computes ("32-true" converts nothing; "64-true" for float64 programs), `loggers` from `make_loggers`. One
    device: these loops are full-batch and their own, so there is nothing for DDP to shard."""
    return Fabric(accelerator=accelerator, devices=1, precision=precision, loggers=loggers or [])


def finish_fabric(fabric: Fabric) -> dict[str, Any]:
    """Close the Fabric's loggers; the engine, the device and the loggers' run folders (for the provenance record)."""
    ids: dict[str, Any] = {"engine": "lightning", "device": str(fabric.device)}
    for logger in fabric.loggers:
        logger.finalize("success")
        if isinstance(logger, CSVLogger):
            ids["csv"] = logger.log_dir
        elif isinstance(logger, WandbLogger):
            exp = logger.experiment
            ids["wandb"] = {"id": exp.id, "offline": bool(exp.offline), "dir": str(exp.dir)}
    return ids
