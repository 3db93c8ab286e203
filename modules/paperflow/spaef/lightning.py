"""Paper-scale training as a Lightning job (`train.engine: lightning`): a LightningModule whose training
step is one step of a `paperflow.spaef.training` task, fitted by `paperflow.core.training.make_trainer` on
the devices the job was given. The "dataset" is one dummy batch per epoch (the whole graph is the batch);
its loader draws from its own generator, so the global torch stream (dropout) is the one the plain loop
sees, and on the CPU the two engines agree bit for bit."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from paperflow.core.training import epoch_history, make_trainer, tracking_ids


class TaskModule(pl.LightningModule):
    def __init__(self, task: torch.nn.Module):
        super().__init__()
        self.task = task

    def training_step(self, batch, batch_idx):
        loss, logs = self.task.step_loss(self.current_epoch)
        for key, value in logs.items():
            self.log(key, value, on_epoch=True, on_step=False, batch_size=1)
        return loss

    def configure_optimizers(self):
        opt, scheduler = self.task.optimizer()
        return opt if scheduler is None else {"optimizer": opt, "lr_scheduler": scheduler}


def fit_lightning(
    task: torch.nn.Module,
    epochs: int,
    run_dir: str | Path,
    name: str,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
) -> tuple[pd.DataFrame, dict[str, Any]]:
    module = TaskModule(task)
    trainer = make_trainer(max_epochs=epochs, run_dir=run_dir, name=name, wandb=wandb, tags=tags, deterministic="warn")
    trainer.fit(module, DataLoader([0], batch_size=1, generator=torch.Generator().manual_seed(0)))
    task.to("cpu")
    return epoch_history(trainer), tracking_ids(trainer) | {"engine": "lightning"}
