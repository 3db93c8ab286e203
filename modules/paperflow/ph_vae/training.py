"""Lightning training of one PH-VAE (or baseline) per seed: module, data module, fit, checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from paperflow.core.training import epoch_history, make_trainer, seed_everything, tracking_ids
from paperflow.core.training import fit as resume_fit
from paperflow.ph_vae.checkpoint import build_vae

log = logging.getLogger(__name__)


class VAEModule(pl.LightningModule):
    """Negative ELBO with Adam (spec 2, Training); logs the epoch means train/loss, train/recon, train/kl."""

    def __init__(self, input_dim: int, decoder: str, model: dict[str, Any], train: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.vae = build_vae(input_dim, decoder, model)

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        terms = self.vae.elbo_terms(x)
        loss = -(terms["recon"] - self.vae.beta * terms["kl"]).mean()
        # epoch sums kept by hand: self.log per step costs more than the step itself on CPU
        sums = torch.stack([loss * len(x), terms["recon"].sum(), terms["kl"].sum(), x.new_tensor(len(x))]).detach()
        self._epoch_sums = sums if batch_idx == 0 else self._epoch_sums + sums
        return loss

    def on_train_epoch_end(self) -> None:
        loss, recon, kl, n = self._epoch_sums
        self.log_dict({"train/loss": loss / n, "train/recon": recon / n, "train/kl": kl / n}, sync_dist=True)

    def configure_gradient_clipping(
        self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm=None
    ) -> None:
        """Norm clipping per independently trained part (`vae.parts()`): the whole VAE, or each coordinate's
        PH-VAE of `ph_indep`, so one part's gradient never rescales another's."""
        if gradient_clip_val:
            for part in self.vae.parts():
                torch.nn.utils.clip_grad_norm_(part.parameters(), gradient_clip_val)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        cfg = self.hparams.train
        return torch.optim.Adam(self.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])


class ArrayDataModule(pl.LightningDataModule):
    def __init__(self, x: np.ndarray, batch_size: int, seed: int) -> None:
        super().__init__()
        self.x = torch.tensor(x, dtype=torch.float32)
        self.batch_size = batch_size
        self.seed = seed
        self._gen: torch.Generator | None = None  # made where it is used: a spawned DDP worker gets no generator

    @property
    def gen(self) -> torch.Generator:
        """The shuffles' stream: each epoch draws its order from it."""
        if self._gen is None:
            self._gen = torch.Generator().manual_seed(self.seed)
        return self._gen

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x), batch_size=self.batch_size, shuffle=True, generator=self.gen)

    def state_dict(self) -> dict[str, Any]:  # in the Trainer's checkpoints: a resumed fit shuffles on as it would have
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["gen"])


def fit(
    x: np.ndarray,
    *,
    decoder: str,
    seed: int,
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    run_dir: str | Path,
    checkpoint: str | Path,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    resume_dir: str | Path | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Train one model on x (n, D), save a Lightning checkpoint; return the epoch history and run ids.

    With `train["devices"] > 1` training is DDP over that many devices; each takes batch_size/devices
    rows per step, so the global batch (and the optimisation) matches a single-device run. With `resume_dir`
    (this fit's folder under the job's `checkpoint_dir()`) the fit saves its state there every 30 min at most and
    at its end, and a rerun resumes from it (the shuffles' generator included) or loads the finished fit."""
    devices = int(train["devices"])
    if train["batch_size"] % devices:
        raise ValueError(f"batch_size {train['batch_size']} is not divisible by devices {devices}")
    seed_everything(seed)
    module = VAEModule(x.shape[1], decoder, dict(model), dict(train))
    trainer = make_trainer(
        max_epochs=train["epochs"],
        run_dir=run_dir,
        name=f"{decoder}-seed{seed}",
        wandb=wandb,
        tags=tags,
        gradient_clip_val=train["grad_clip"],
        devices=devices,
        checkpoint_dir=resume_dir,
        checkpoint_at_end=resume_dir is not None,
    )
    resume_fit(trainer, module, datamodule=ArrayDataModule(x, train["batch_size"] // devices, seed))
    trainer.save_checkpoint(str(checkpoint))
    frame = epoch_history(trainer).assign(seed=seed, decoder=decoder)
    last = frame.iloc[-1]
    log.info(
        "trained %s seed %d on %d device(s): final loss %.4f kl %.4f", decoder, seed, devices, last["loss"], last["kl"]
    )
    return frame, tracking_ids(trainer)
