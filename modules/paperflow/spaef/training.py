"""Full-batch training of the adjacency autoencoder (spot graph, §2.2.4) and of the SpaEF denoiser (§2.4).
Each epoch is one step on the whole graph; the denoiser keeps the mu of the epoch with the lowest
training loss, as the released code does.

The maths of a step lives in two torch-only tasks (`AdjacencyTask`, `DenoiserTask`); two engines drive
them with the same random streams (`train.engine`):
- `loop` (smoke scale): the plain torch loop `paperflow.core.loop.run_loop`. A fit lasts seconds there, and importing
  Lightning alone costs about 4 s of CPU per job, which the 3-minute smoke budget does not leave.
- `lightning` (tiny and paper scale): `paperflow.spaef.lightning`, a LightningModule around the same task,
  fitted by `paperflow.core.training.make_trainer` on the job's devices (CSV logging, wandb when enabled).
On the CPU both give the same numbers bit for bit (tests check it)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from paperflow.core.loop import run_loop
from paperflow.core.seeding import seed_all
from paperflow.spaef.model import Adjacency, AdjacencyAE, SpaEF, with_self_loops, zinb_loss
from paperflow.spaef.settings import known_keys

log = logging.getLogger(__name__)

ENGINES = ("loop", "lightning")


def edge_tensor(edges: np.ndarray, n: int) -> torch.Tensor:
    """(E, 2) numpy source/target pairs -> (2, E') long tensor with self-loops."""
    return with_self_loops(torch.as_tensor(np.asarray(edges, dtype=np.int64).reshape(-1, 2).T.copy()), n)


class AdjacencyTask(nn.Module):
    """One step of the adjacency AE: BCE of Z Z^T against the (Delaunay) adjacency, positives up-weighted."""

    def __init__(self, emb: np.ndarray, edges: np.ndarray, cfg: Mapping[str, Any]):
        super().__init__()
        known_keys("graphs.spot", cfg)
        n = len(emb)
        self.net = AdjacencyAE(
            emb.shape[1], cfg["hidden"], cfg["heads"], cfg["latent"], cfg["dropout"], cfg["double_sigmoid"]
        )
        self.register_buffer("x", torch.as_tensor(emb, dtype=torch.float32))
        self.edges = Adjacency(edge_tensor(edges, n), n)
        target = torch.zeros(n, n)
        target[edges[:, 0], edges[:, 1]] = 1.0
        self.register_buffer("target", target)
        n_pos = float(len(edges))
        self.register_buffer("pos_weight", torch.tensor((n * n - n_pos) / n_pos))
        self.lr = float(cfg["lr"])

    def step_loss(self, epoch: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits, _ = self.net(self.x, self.edges)
        loss = F.binary_cross_entropy_with_logits(logits, self.target, pos_weight=self.pos_weight)
        return loss, {"loss": loss}

    def optimizer(self) -> tuple[torch.optim.Optimizer, Any]:
        return torch.optim.Adam(self.net.parameters(), lr=self.lr, foreach=True), None  # one multi-tensor update

    def latent(self) -> np.ndarray:
        self.eval()
        with torch.no_grad():
            return self.net.encode(self.x, self.edges).cpu().numpy()


class DenoiserTask(nn.Module):
    """One step of SpaEF: ZINB loss of X under the fused decoder; remembers mu and the gate at the lowest
    training loss (the released code saves mu whenever the training loss improves)."""

    def __init__(
        self,
        x: np.ndarray,
        spot_edges: np.ndarray,
        gene_edges: np.ndarray,
        model: Mapping[str, Any],
        train: Mapping[str, Any],
        fusion: str,
    ):
        super().__init__()
        known_keys("model", model)
        known_keys("train", train)
        n, g = x.shape
        self.net = SpaEF(n, g, model["hidden"], model["latent"], model["heads"], model["dropout"], fusion)
        self.register_buffer("x", torch.as_tensor(x, dtype=torch.float32))
        self.spot_edges = Adjacency(edge_tensor(spot_edges, n), n)
        self.gene_edges = Adjacency(edge_tensor(gene_edges, g), g)
        self.train_cfg = dict(train)
        self.best_loss, self.best_epoch, self.best_mu, self.best_w = float("inf"), -1, None, None

    def step_loss(self, epoch: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        out = self.net(self.x, self.spot_edges, self.gene_edges)
        loss = zinb_loss(self.x, out["mu"], out["theta"], out["pi"], self.train_cfg["mu_penalty"])
        if loss.item() < self.best_loss:
            self.best_loss, self.best_epoch = loss.item(), epoch
            self.best_mu, self.best_w = out["mu"].detach().cpu().numpy(), out["w"].detach().cpu().numpy()
        return loss, {"loss": loss, "w_mean": out["w"].mean()}

    def optimizer(self) -> tuple[torch.optim.Optimizer, Any]:
        opt = torch.optim.Adam(self.net.parameters(), lr=self.train_cfg["lr"], foreach=True)
        return opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=self.train_cfg["gamma"])


def fit_loop(task: AdjacencyTask | DenoiserTask, epochs: int, name: str, progress: bool | None = None) -> pd.DataFrame:
    """Train `task` for `epochs` full-batch steps; the per-epoch logs as Lightning's CSV logger writes them."""
    opt, scheduler = task.optimizer()
    task.train()
    records = run_loop(
        task.step_loss,
        opt,
        epochs,
        scheduler=scheduler,
        deterministic=True,  # as the Lightning engine's trainer (deterministic="warn")
        desc=name,
        progress=progress,
    )
    return pd.DataFrame(records).rename(columns={"step": "epoch"})


def _fit(
    task,
    epochs: int,
    engine: str,
    run_dir: str | Path,
    name: str,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    checkpoint_dir: str | Path | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """`task` fitted by `engine`; with `checkpoint_dir` (the job's, Lightning only) the fit checkpoints into
    `checkpoint_dir`/<name> and a rerun resumes it."""
    if engine == "loop":
        if checkpoint_dir is not None:
            raise ValueError("train.engine = 'loop' takes no checkpoint_dir: the plain loop's fits do not checkpoint")
        return fit_loop(task, epochs, name), {"engine": "loop"}
    if engine == "lightning":
        from paperflow.spaef.lightning import fit_lightning

        folder = None if checkpoint_dir is None else Path(checkpoint_dir) / name
        return fit_lightning(task, epochs, run_dir, name, wandb, tags, folder)
    raise ValueError(f"train.engine = {engine!r}: not one of {ENGINES}")


def fit_spot_latent(
    emb: np.ndarray,
    edges: np.ndarray,
    cfg: Mapping[str, Any],
    seed: int,
    run_dir: str | Path,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    engine: str,
    checkpoint_dir: str | Path | None = None,
) -> tuple[np.ndarray, pd.DataFrame, dict[str, Any]]:
    """Train the adjacency AE on (embeddings, Delaunay edges as given); return Z in eval mode."""
    seed_all(seed)
    task = AdjacencyTask(emb, edges, cfg)
    history, tracking = _fit(
        task, int(cfg["epochs"]), engine, run_dir, f"spot_graph_seed{seed}", wandb, tags, checkpoint_dir
    )
    return task.latent(), history.assign(seed=seed), tracking


def fit_denoiser(
    x: np.ndarray,
    spot_edges: np.ndarray,
    gene_edges: np.ndarray,
    *,
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    fusion: str,
    seed: int,
    run_dir: str | Path,
    name: str,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    checkpoint_dir: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray, pd.DataFrame, dict[str, Any]]:
    """Returns (mu at the lowest training loss, its gate w, epoch history, tracking ids)."""
    seed_all(seed)
    task = DenoiserTask(x, spot_edges, gene_edges, model, train, fusion)
    history, tracking = _fit(task, int(train["epochs"]), train["engine"], run_dir, name, wandb, tags, checkpoint_dir)
    log.info("%s: best training loss %.5f at epoch %d", name, task.best_loss, task.best_epoch)
    return (
        task.best_mu,
        task.best_w,
        history.assign(seed=seed),
        tracking | {"best_epoch": task.best_epoch, "best_loss": task.best_loss},
    )
