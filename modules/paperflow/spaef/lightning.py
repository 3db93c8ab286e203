"""Paper-scale training as a Lightning job (`train.engine: lightning`): a `paperflow.core.training.StepModule`
whose training step is one step of a `paperflow.spaef.training` task (the whole graph is the batch), fitted by
`paperflow.core.training.fit_steps` on the devices the job was given, with the task's own optimizer and scheduler.
The steps draw dropout from the global torch stream, which the Trainer's dummy loader leaves alone, so on the CPU
the two engines agree bit for bit."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.training import StepModule, epoch_history, fit_steps, tracking_ids


class _Best:
    """What a task keeps outside its weights: the denoiser's best loss, epoch, mu and gate (none for the AE)."""

    KEYS = ("best_loss", "best_epoch", "best_mu", "best_w")

    def __init__(self, task: torch.nn.Module):
        self.task = task

    def state_dict(self) -> dict[str, Any]:  # arrays as tensors: the checkpoint loads with weights_only
        state = {k: getattr(self.task, k) for k in self.KEYS if hasattr(self.task, k)}
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self.task, key, value.numpy() if isinstance(value, torch.Tensor) else value)


def fit_lightning(
    task: torch.nn.Module,
    epochs: int,
    run_dir: str | Path,
    name: str,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    checkpoint_dir: str | Path | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """`task` fitted for `epochs` steps; with `checkpoint_dir` (this fit's own folder) it checkpoints there and
    resumes from there, its best iterate (the denoiser's best_* records) included."""
    opt, scheduler = task.optimizer()
    optimizers = opt if scheduler is None else {"optimizer": opt, "lr_scheduler": scheduler}
    module = StepModule(task.step_loss, [task], optimizers, state=_Best(task))
    trainer = fit_steps(
        module, epochs, checkpoint_dir=checkpoint_dir, run_dir=run_dir, name=name, wandb=wandb, tags=tags
    )
    task.to("cpu")
    return epoch_history(trainer), tracking_ids(trainer) | {"engine": "lightning"}
