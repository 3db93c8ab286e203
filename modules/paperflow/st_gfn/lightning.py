"""Paper-scale training as a Lightning job (conventions section 6): a LightningModule whose training step is
one `TrainingRun` iteration, fitted by `paperflow.core.training.make_trainer` on the devices the job was
given. GFlowNet training samples its own data, so the "dataset" is the iteration counter; the module
builds the env, the sampler and the visit counts on its device when the fit starts.

On the CPU it reproduces `training.train_one` exactly (same seed, same losses; tests check it): the
iteration counter (`Iterations`) is a plain iterable, which draws nothing from the global torch stream the
sampler uses. The games (`paperflow.st_gfn.game_training`) use the same module shape: `GameModule` drives a
`GameRun` and reproduces `train_game` on the CPU.

A fit is one epoch of `iterations` batches, so a long one is saved mid-epoch (`fit_one(checkpoint_dir=...)`:
`paperflow.core.training.ResumeCheckpoint`, with the global generators) and resumed there (on the CPU bit-equal
to an uninterrupted fit; tests check it): Lightning saves `Iterations`' position in its checkpoint and restores it
before it iterates again, and the module saves the run's own state (records, visit counts, the reward-noise
generator; `TrainingRun.state_dict`) beside the weights and the optimizer.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytorch_lightning as pl
import torch

from paperflow.core.resume import EVERY_S
from paperflow.core.training import fit, make_trainer, seed_everything, tracking_ids
from paperflow.st_gfn.envs import make_env
from paperflow.st_gfn.game_training import GameRun, make_game_net
from paperflow.st_gfn.games import GAME_KINDS, make_game
from paperflow.st_gfn.models import make_gflownet, optimizer
from paperflow.st_gfn.settings import known_keys
from paperflow.st_gfn.training import TrainingRun


class Iterations:
    """The "dataset" of a run: the iteration indices 0 .. n-1, one a batch, resumable mid-epoch. Lightning's fit
    loop saves `state_dict()` in its checkpoints and gives it back to `load_state_dict` before it iterates again
    (a loader with the two methods is "stateful" to it). The position is the next iteration not yet trained,
    set by the module's training step (`done`), not by the iterator: Lightning fetches a batch ahead, and that
    prefetched iteration must come again on a resume."""

    def __init__(self, n: int) -> None:
        self.n, self.next = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.next if self.next < self.n else 0, self.n))  # after a whole epoch, the next starts at 0

    def done(self, iteration: int) -> None:
        self.next = iteration + 1

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.next = int(state["next"])


class RunModule(pl.LightningModule):
    """A training run as a LightningModule: `self.net` is what the optimizer trains, `self.run` (built on
    the fit's device by `on_fit_start`) does one iteration's work per "batch" (the iteration index). The run's
    state is saved in the Trainer's checkpoints and restored from them (after `on_fit_start` has built it)."""

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
        self.iterations = Iterations(iterations)
        self.run = None
        self.restored: dict[str, Any] | None = None  # a checkpoint's run state, until on_fit_start builds the run

    def train_dataloader(self) -> Iterations:
        return self.iterations

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return optimizer(self.net, self.train_cfg["lr"], self.train_cfg["lr_logz"])

    def on_fit_start(self) -> None:
        self.run = self.make_run()
        if self.restored is not None:
            self.run.load_state_dict(self.restored)
            self.restored = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["run"] = self.run.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.restored = checkpoint["run"]  # Lightning loads a checkpoint before on_fit_start

    def training_step(self, iteration: int, batch_idx: int) -> torch.Tensor:
        loss = self.run.loss(iteration)
        # recorded here, not in on_train_batch_end: a checkpoint callback saves in its own hook of that name, which
        # Lightning calls before the module's
        self.run.record_loss(iteration, loss)
        self.iterations.done(iteration)
        self.log("train/loss", loss.detach(), on_step=True, on_epoch=False, batch_size=self.run.batch)
        return loss


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

    def make_run(self) -> TrainingRun:
        env = make_env(self.env_spec, self.target, device=self.device)
        return TrainingRun(env, self.env_spec, self.method, self.gflownet, self.train_cfg, self.seed)


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

    def make_run(self) -> GameRun:
        return GameRun(self.game, self.env_spec, self.method, self.gamenet, self.train_cfg, self.seed, self.target)


RESULT = "result.pt"  # a finished fit's results in its checkpoint folder
FIT = "fit"  # the subfolder of an unfinished fit's checkpoints


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
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
):
    """Train one method with one seed through Lightning. Returns (state_dict of the GFlowNet / game network, history,
    visited terminal states, tracking ids). `deterministic="warn"`: deterministic kernels where torch has
    them, a warning (not an error) for the scatter-adds of the visit counts on a GPU.

    With `checkpoint_dir` (this fit's own folder under the job's `checkpoint_dir()`, one a seed), the fit saves in
    its `fit` subfolder every `checkpoint_every_s` seconds at most (mid-epoch) and a rerun resumes there; the
    finished fit's results are written to `result.pt` in the folder (aside, then renamed) and the subfolder removed,
    and a rerun returns them without fitting."""
    known_keys("model", model)
    known_keys("train", train)
    result = None if checkpoint_dir is None else Path(checkpoint_dir) / RESULT
    if result is not None and result.exists():
        done = torch.load(result, map_location="cpu", weights_only=False)  # this job's own file: frames pickled
        return done["state"], done["history"], done["visits"], done["tracking"]
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
        checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir) / FIT,
        checkpoint_every_s=checkpoint_every_s,
    )
    fit(trainer, module)
    state = {k: v.detach().cpu() for k, v in module.net.state_dict().items()}
    out = state, module.run.history(), module.run.visits(), tracking_ids(trainer)
    if result is not None:
        result.parent.mkdir(parents=True, exist_ok=True)  # a fit shorter than one checkpoint interval made none
        tmp = result.with_suffix(".tmp")
        torch.save(dict(zip(("state", "history", "visits", "tracking"), out)), tmp)
        os.replace(tmp, result)
        shutil.rmtree(result.parent / FIT, ignore_errors=True)
    return out
