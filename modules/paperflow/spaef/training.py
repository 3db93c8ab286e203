"""Full-batch Lightning training of the adjacency autoencoder (spot graph, §2.2.4) and of the SpaEF
denoiser (§2.4). Each epoch is one step on the whole graph; the denoiser keeps the mu of the epoch
with the lowest training loss, as the released code does."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from paperflow.core.training import epoch_history, make_trainer, seed_everything, tracking_ids
from paperflow.spaef.model import AdjacencyAE, SpaEF, with_self_loops, zinb_loss

log = logging.getLogger(__name__)


def one_batch() -> DataLoader:
    return DataLoader([0], batch_size=1)


def edge_tensor(edges: np.ndarray, n: int) -> torch.Tensor:
    """(E, 2) numpy source/target pairs -> (2, E') long tensor with self-loops."""
    return with_self_loops(torch.as_tensor(np.asarray(edges, dtype=np.int64).reshape(-1, 2).T.copy()), n)


class AdjacencyModule(pl.LightningModule):
    def __init__(self, emb: np.ndarray, edges: np.ndarray, cfg: Mapping[str, Any]):
        super().__init__()
        n = len(emb)
        self.net = AdjacencyAE(emb.shape[1], cfg["hidden"], cfg["heads"], cfg["latent"], cfg["dropout"], cfg["double_sigmoid"])
        self.register_buffer("x", torch.as_tensor(emb, dtype=torch.float32))
        self.register_buffer("edges", edge_tensor(edges, n))
        target = torch.zeros(n, n)
        target[edges[:, 0], edges[:, 1]] = 1.0
        self.register_buffer("target", target)
        n_pos = float(len(edges))
        self.register_buffer("pos_weight", torch.tensor((n * n - n_pos) / n_pos))
        self.lr = cfg["lr"]

    def training_step(self, batch, batch_idx):
        logits, _ = self.net(self.x, self.edges)
        loss = F.binary_cross_entropy_with_logits(logits, self.target, pos_weight=self.pos_weight)
        self.log("loss", loss, on_epoch=True, on_step=False, batch_size=1)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr, foreach=True)  # one multi-tensor update, the same numbers


def fit_spot_latent(emb: np.ndarray, edges: np.ndarray, cfg: Mapping[str, Any], seed: int, run_dir: str | Path,
                    wandb: Mapping[str, Any] | None, tags: dict[str, str]) -> tuple[np.ndarray, pd.DataFrame, dict[str, Any]]:
    """Train the adjacency AE on (embeddings, Delaunay edges as given); return Z in eval mode."""
    seed_everything(seed)
    module = AdjacencyModule(emb, edges, cfg)
    trainer = make_trainer(max_epochs=cfg["epochs"], run_dir=run_dir, name=f"spot_graph_seed{seed}", wandb=wandb, tags=tags,
                           deterministic="warn")
    trainer.fit(module, one_batch())
    module.eval()
    with torch.no_grad():
        z = module.net.encode(module.x, module.edges).cpu().numpy()
    return z, epoch_history(trainer).assign(seed=seed), tracking_ids(trainer)


class DenoiserModule(pl.LightningModule):
    def __init__(self, x: np.ndarray, spot_edges: np.ndarray, gene_edges: np.ndarray, model: Mapping[str, Any], train: Mapping[str, Any], fusion: str):
        super().__init__()
        n, g = x.shape
        self.net = SpaEF(n, g, model["hidden"], model["latent"], model["heads"], model["dropout"], fusion)
        self.register_buffer("x", torch.as_tensor(x, dtype=torch.float32))
        self.register_buffer("spot_edges", edge_tensor(spot_edges, n))
        self.register_buffer("gene_edges", edge_tensor(gene_edges, g))
        self.train_cfg = dict(train)
        self.best_loss, self.best_epoch, self.best_mu, self.best_w = float("inf"), -1, None, None

    def training_step(self, batch, batch_idx):
        out = self.net(self.x, self.spot_edges, self.gene_edges)
        loss = zinb_loss(self.x, out["mu"], out["theta"], out["pi"], self.train_cfg["mu_penalty"])
        if loss.item() < self.best_loss:  # the released code saves mu whenever the training loss improves
            self.best_loss, self.best_epoch = loss.item(), self.current_epoch
            self.best_mu, self.best_w = out["mu"].detach().cpu().numpy(), out["w"].detach().cpu().numpy()
        self.log("loss", loss, on_epoch=True, on_step=False, batch_size=1)
        self.log("w_mean", out["w"].mean(), on_epoch=True, on_step=False, batch_size=1)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.train_cfg["lr"], foreach=True)  # see AdjacencyModule
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ExponentialLR(opt, gamma=self.train_cfg["gamma"])}


def fit_denoiser(x: np.ndarray, spot_edges: np.ndarray, gene_edges: np.ndarray, *, model: Mapping[str, Any], train: Mapping[str, Any],
                 fusion: str, seed: int, run_dir: str | Path, name: str, wandb: Mapping[str, Any] | None,
                 tags: dict[str, str]) -> tuple[np.ndarray, np.ndarray, pd.DataFrame, dict[str, Any]]:
    """Returns (mu at the lowest training loss, its gate w, epoch history, tracking ids)."""
    seed_everything(seed)
    module = DenoiserModule(x, spot_edges, gene_edges, model, train, fusion)
    trainer = make_trainer(max_epochs=train["epochs"], run_dir=run_dir, name=name, wandb=wandb, tags=tags, deterministic="warn")
    trainer.fit(module, one_batch())
    log.info("%s: best training loss %.5f at epoch %d", name, module.best_loss, module.best_epoch)
    history = epoch_history(trainer).assign(seed=seed)
    return module.best_mu, module.best_w, history, tracking_ids(trainer) | {"best_epoch": module.best_epoch, "best_loss": module.best_loss}
