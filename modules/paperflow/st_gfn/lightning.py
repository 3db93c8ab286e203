"""Paper-scale training as a Lightning job (conventions section 6): a LightningModule whose training step is
one `TrainingRun` iteration, fitted by `paperflow.core.training.make_trainer` on the devices the job was
given. GFlowNet training samples its own data, so the "dataset" is the iteration counter; the module
builds the env, the sampler and the visit counts on its device when the fit starts.

On the CPU it reproduces `training.train_one` exactly (same seed, same losses; tests check it): the data
loader draws its base seed from its own generator, not from the global torch stream the sampler uses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from paperflow.core.training import make_trainer, seed_everything, tracking_ids
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.models import make_gflownet, optimizer
from paperflow.st_gfn.training import TrainingRun


class GFlowNetModule(pl.LightningModule):
    def __init__(self, env_spec: Mapping[str, Any], target: pd.DataFrame | None, method: Mapping[str, Any],
                 model: Mapping[str, Any], train: Mapping[str, Any], seed: int) -> None:
        super().__init__()
        self.env_spec, self.target, self.method, self.train_cfg, self.seed = dict(env_spec), target, dict(method), dict(train), seed
        self.gflownet = make_gflownet(make_env(env_spec, target), method, model)
        self.run: TrainingRun | None = None

    def on_fit_start(self) -> None:
        env = make_env(self.env_spec, self.target, device=self.device)
        self.run = TrainingRun(env, self.env_spec, self.method, self.gflownet, self.train_cfg, self.seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(range(int(self.train_cfg["iterations"])), batch_size=None, shuffle=False,
                          generator=torch.Generator().manual_seed(self.seed))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return optimizer(self.gflownet, self.train_cfg["lr"], self.train_cfg["lr_logz"])

    def training_step(self, iteration: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.run.loss(int(iteration))
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, batch_size=self.run.batch)
        return loss

    def on_train_batch_end(self, outputs: Mapping[str, torch.Tensor], iteration: torch.Tensor, batch_idx: int) -> None:
        self.run.record_loss(int(iteration), outputs["loss"])


def fit_one(env_spec: Mapping[str, Any], target: pd.DataFrame | None, method: Mapping[str, Any],
            model: Mapping[str, Any], train: Mapping[str, Any], seed: int, *, run_dir: str | Path, name: str,
            wandb: Mapping[str, Any] | None = None, tags: dict[str, str] | None = None):
    """Train one method with one seed through Lightning. Returns (state_dict of the GFlowNet, history,
    visited terminal states, tracking ids). `deterministic="warn"`: deterministic kernels where torch has
    them, a warning (not an error) for the scatter-adds of the visit counts on a GPU."""
    seed_everything(seed)
    module = GFlowNetModule(env_spec, target, method, model, train, seed)
    trainer = make_trainer(max_epochs=1, run_dir=run_dir, name=name, wandb=wandb, tags=tags,
                           gradient_clip_val=float(train["grad_clip"]), deterministic="warn")
    trainer.fit(module)
    state = {k: v.detach().cpu() for k, v in module.gflownet.state_dict().items()}
    return state, module.run.history(), module.run.visits(), tracking_ids(trainer)
