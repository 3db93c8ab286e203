"""Paper-scale training as a Lightning job (conventions section 6): a LightningModule whose training step is
one `TrainingRun` iteration, fitted by `paperflow.core.training.make_trainer` on the devices the job was
given. GFlowNet training samples its own data, so the "dataset" is the iteration counter; the module
builds the env, the sampler and the visit counts on its device when the fit starts.

On the CPU it reproduces `training.train_one` exactly (same seed, same losses; tests check it): the data
loader draws its base seed from its own generator, not from the global torch stream the sampler uses.
The games (`paperflow.st_gfn.game_training`) use the same module shape: `GameModule` drives a `GameRun`
and reproduces `train_game` on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from paperflow.core.training import make_trainer, seed_everything, tracking_ids
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.game_training import GameRun, make_game_net
from paperflow.st_gfn.games import GAME_KINDS, make_game
from paperflow.st_gfn.models import make_gflownet, optimizer
from paperflow.st_gfn.settings import known_keys
from paperflow.st_gfn.training import TrainingRun


class RunModule(pl.LightningModule):
    """A training run as a LightningModule: `self.net` is what the optimizer trains, `self.run` (built on
    the fit's device by `on_fit_start`) does one iteration's work per "batch" (the iteration index)."""

    def __init__(
        self,
        env_spec: Mapping[str, Any],
        target: pd.DataFrame | None,
        method: Mapping[str, Any],
        train: Mapping[str, Any],
        seed: int,
        iterations: int,
    ) -> None:
        super().__init__()
        self.env_spec, self.target, self.method, self.train_cfg, self.seed = (
            dict(env_spec),
            target,
            dict(method),
            dict(train),
            seed,
        )
        self.iterations = iterations
        self.run = None

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            range(self.iterations), batch_size=None, shuffle=False, generator=torch.Generator().manual_seed(self.seed)
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return optimizer(self.net, self.train_cfg["lr"], self.train_cfg["lr_logz"])

    def training_step(self, iteration: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.run.loss(int(iteration))
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, batch_size=self.run.batch)
        return loss

    def on_train_batch_end(self, outputs: Mapping[str, torch.Tensor], iteration: torch.Tensor, batch_idx: int) -> None:
        self.run.record_loss(int(iteration), outputs["loss"])


class GFlowNetModule(RunModule):
    def __init__(
        self,
        env_spec: Mapping[str, Any],
        target: pd.DataFrame | None,
        method: Mapping[str, Any],
        model: Mapping[str, Any],
        train: Mapping[str, Any],
        seed: int,
    ) -> None:
        super().__init__(env_spec, target, method, train, seed, int(train["iterations"]))
        self.gflownet = make_gflownet(make_env(env_spec, target), method, model)

    @property
    def net(self) -> torch.nn.Module:
        return self.gflownet

    def on_fit_start(self) -> None:
        env = make_env(self.env_spec, self.target, device=self.device)
        self.run = TrainingRun(env, self.env_spec, self.method, self.gflownet, self.train_cfg, self.seed)


class GameModule(RunModule):
    """Self-play on a game (`game_training.GameRun`); the env spec carries the game's own iteration budget."""

    def __init__(
        self,
        env_spec: Mapping[str, Any],
        target: pd.DataFrame,
        method: Mapping[str, Any],
        model: Mapping[str, Any],
        train: Mapping[str, Any],
        seed: int,
    ) -> None:
        super().__init__(env_spec, target, method, train, seed, int(env_spec["iterations"]))
        self.game = make_game(env_spec)
        self.gamenet = make_game_net(self.game, method, model)

    @property
    def net(self) -> torch.nn.Module:
        return self.gamenet

    def on_fit_start(self) -> None:
        self.run = GameRun(self.game, self.env_spec, self.method, self.gamenet, self.train_cfg, self.seed, self.target)


def fit_one(
    env_spec: Mapping[str, Any],
    target: pd.DataFrame | None,
    method: Mapping[str, Any],
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    seed: int,
    *,
    run_dir: str | Path,
    name: str,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
):
    """Train one method with one seed through Lightning. Returns (state_dict of the GFlowNet / game network, history,
    visited terminal states, tracking ids). `deterministic="warn"`: deterministic kernels where torch has
    them, a warning (not an error) for the scatter-adds of the visit counts on a GPU."""
    known_keys("model", model)
    known_keys("train", train)
    seed_everything(seed)
    kind = GameModule if env_spec["kind"] in GAME_KINDS else GFlowNetModule
    module = kind(env_spec, target, method, model, train, seed)
    trainer = make_trainer(
        max_epochs=1,
        run_dir=run_dir,
        name=name,
        wandb=wandb,
        tags=tags,
        gradient_clip_val=float(train["grad_clip"]),
        deterministic="warn",
    )
    trainer.fit(module)
    state = {k: v.detach().cpu() for k, v in module.net.state_dict().items()}
    return state, module.run.history(), module.run.visits(), tracking_ids(trainer)
