"""Paper-scale fits as Lightning jobs (`train.engine: lightning`; CONVENTIONS §6): a LightningModule whose
training step is one step of a safer fit (`paperflow.safer.fitting.Step`: GRACE, one expert, one class-IL stage),
fitted by `paperflow.core.training.make_trainer` (`accelerator="auto"`: a GPU where the job has one; CSV logging
always, wandb when enabled). The "dataset" is one dummy batch per epoch (the whole task graph is the batch), drawn
from its loader's own generator; the steps draw only from their own generators, and the optimizer is the one the
plain loop would use, so on the CPU both engines agree bit for bit. This module imports Lightning; only the
lightning branch of `paperflow.safer.fitting.fit_steps` imports it."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from paperflow.core.training import make_trainer
from paperflow.safer.fitting import Engine, Step


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


class StepModule(pl.LightningModule):
    def __init__(self, step: Step, data: dict[str, Any], modules: list[nn.Module], opt: torch.optim.Optimizer):
        super().__init__()
        self.fits = nn.ModuleList(modules)
        self.fit_step, self.fit_data, self.fit_opt = step, data, opt
        self.losses: list[float] = []

    def on_fit_start(self) -> None:
        self.fit_data = _to(self.fit_data, self.device)

    def training_step(self, batch, batch_idx):
        loss = self.fit_step(self.current_epoch, self.fit_data)
        self.losses.append(float(loss))
        self.log("loss", loss.detach(), on_epoch=True, on_step=False, batch_size=1)
        return loss

    def configure_optimizers(self):
        return self.fit_opt


def fit_lightning(
    step: Step,
    data: dict[str, Any],
    modules: list[nn.Module],
    opt: torch.optim.Optimizer,
    epochs: int,
    engine: Engine,
    name: str,
) -> list[float]:
    """The plain loop's `epochs` steps under a Trainer; the modules come back on the CPU in their own train/eval
    modes (the Trainer sets train mode), `data` is left as it was."""
    modes = [[m.training for m in module.modules()] for module in modules]
    module = StepModule(step, data, modules, opt)
    trainer = make_trainer(
        max_epochs=epochs,
        run_dir=engine.run_dir,
        name=name,
        wandb=engine.wandb,
        tags=dict(engine.tags),
        deterministic="warn",
    )
    trainer.fit(module, DataLoader([0], batch_size=1, generator=torch.Generator().manual_seed(0)))
    for m, flags in zip(modules, modes):
        m.to("cpu")
        for sub, flag in zip(m.modules(), flags):
            sub.training = flag
    return module.losses
