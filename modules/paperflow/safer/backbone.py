"""The frozen backbone (spec §2.2 step 0, after TPP): an SGC encoder f(X) = Â^k X W + b pretrained on
the first task's graph with GRACE (Zhu et al. 2020) and then frozen for every later task."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from paperflow.core.config import reject_unknown
from paperflow.safer.fitting import LOOP, Engine, fit_steps
from paperflow.safer.graph import gcn_norm, propagate, to_torch

BACKBONE_KEYS = ("k", "hidden", "epochs", "lr", "weight_decay", "edge_drop", "feature_drop", "tau", "batch_nodes")


class SGC(nn.Module):
    """f(X) = Â^k X W + b: parameter-free propagation, then one linear map."""

    def __init__(self, d_in: int, d_out: int, k: int) -> None:
        super().__init__()
        self.k = k
        self.lin = nn.Linear(d_in, d_out)

    def forward(self, a_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.lin(propagate(a_hat, x, self.k))


def drop_edges(adj: sp.csr_matrix, p: float, rng: np.random.Generator) -> sp.csr_matrix:
    """Each undirected edge removed with probability p (both directions together)."""
    upper = sp.triu(adj, k=1).tocoo()
    keep = rng.random(upper.nnz) >= p
    kept = sp.csr_matrix((upper.data[keep], (upper.row[keep], upper.col[keep])), shape=adj.shape)
    return (kept + kept.T).tocsr()


def mask_features(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """Zero each feature dimension (a whole column) with probability p."""
    keep = (torch.rand(x.shape[1], generator=gen) >= p).to(device=x.device, dtype=x.dtype)
    return x * keep


def grace_loss(h1: torch.Tensor, h2: torch.Tensor, tau: float) -> torch.Tensor:
    """GRACE's symmetric loss: for node i the positive pair is (h1_i, h2_i); negatives are every other
    node in the other view and in the same view. Cosine similarities over temperature tau."""

    def one_side(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = F.normalize(a, dim=1), F.normalize(b, dim=1)
        between = torch.exp(a @ b.T / tau)
        within = torch.exp(a @ a.T / tau)
        denom = between.sum(1) + within.sum(1) - within.diagonal()
        return -torch.log(between.diagonal() / denom)

    return 0.5 * (one_side(h1, h2) + one_side(h2, h1)).mean()


def pretrain_grace(
    x: np.ndarray,
    adj: sp.csr_matrix,
    cfg: Mapping[str, Any],
    seed: int,
    progress: bool = False,
    engine: Engine = LOOP,
) -> tuple[SGC, list[float]]:
    """Pretrain an SGC on one graph (task 1) with GRACE; returns the frozen encoder (on the CPU) and the loss per
    epoch. `cfg` is the `backbone` config block; `engine` the `train.engine` (paperflow.safer.fitting)."""
    reject_unknown(cfg, BACKBONE_KEYS, "safer backbone")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    xt = torch.as_tensor(x, dtype=torch.float32)
    encoder = SGC(x.shape[1], cfg["hidden"], cfg["k"])
    d = cfg["hidden"]
    head = nn.Sequential(nn.Linear(d, d), nn.ELU(), nn.Linear(d, d))
    opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    batch = cfg["batch_nodes"]

    def step(epoch: int, data: Mapping[str, Any]) -> torch.Tensor:
        xt = data["x"]
        views = [
            (
                to_torch(gcn_norm(drop_edges(adj, cfg["edge_drop"], rng))).to(xt.device),
                mask_features(xt, cfg["feature_drop"], gen),
            )
            for _ in range(2)
        ]
        h1, h2 = (head(encoder(a, v)) for a, v in views)
        if batch and batch < len(x):  # the loss is O(n^2): large task graphs use a node sample per epoch
            idx = torch.randperm(len(x), generator=gen)[:batch].to(xt.device)
            h1, h2 = h1[idx], h2[idx]
        return grace_loss(h1, h2, cfg["tau"])

    losses = fit_steps(
        step, {"x": xt}, [encoder, head], opt, cfg["epochs"], "GRACE", progress, engine, f"grace_seed{seed}"
    )
    encoder.requires_grad_(False)
    return encoder.eval(), losses
