"""Class-incremental baselines (spec §3): one network (the pretrained SGC, unfrozen) with a single head
over every class seen so far, trained on each new task's graph alone. `finetune` is the lower bound;
`ewc` adds the elastic weight consolidation penalty (Kirkpatrick et al. 2017) with CGLB's Fisher: the
squared gradient of the task's full-batch loss at the end of the task."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paperflow.core.config import reject_unknown
from paperflow.safer.backbone import SGC
from paperflow.safer.fitting import LOOP, Engine, fit_steps

CLASS_IL_KEYS = ("epochs", "lr", "weight_decay", "ewc_strength", "energy_temperature")


class ClassIL(nn.Module):
    """Backbone + one linear head whose column c is the c-th class in learning order."""

    def __init__(self, backbone: SGC, n_classes: int) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(backbone).requires_grad_(True).train()
        self.head = nn.Linear(backbone.lin.out_features, n_classes)

    def forward(self, a_hat: torch.Tensor, x: torch.Tensor, seen: int) -> torch.Tensor:
        """Logits over the first `seen` classes (those learned so far)."""
        return self.head(self.backbone(a_hat, x))[:, :seen]


def ewc_penalty(model: ClassIL, anchors: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]) -> torch.Tensor:
    """Σ over earlier tasks of Σ_p F_p (θ_p − θ*_p)²."""
    params = dict(model.named_parameters())
    total = torch.zeros(())
    for fisher, optimum in anchors:
        for name, f in fisher.items():
            total = total + (f * (params[name] - optimum[name]).pow(2)).sum()
    return total


def train_stage(
    model: ClassIL,
    a_hat: torch.Tensor,
    x: torch.Tensor,
    train_idx: torch.Tensor,
    y: torch.Tensor,
    seen: int,
    cfg: Mapping[str, Any],
    anchors: list | None,
    progress: bool = False,
    engine: Engine = LOOP,
    name: str = "class_il",
) -> list[float]:
    """One stage: cross-entropy over the `seen` classes on this task's training nodes (labels `y` are
    learning-order positions), plus strength × the EWC penalty when `anchors` is given; `cfg` is the
    `class_il` config block (fine-tuning's without `ewc_strength`); `engine` the `train.engine`
    (paperflow.safer.fitting; `name` names a Lightning fit's logs)."""
    reject_unknown(cfg, CLASS_IL_KEYS, "safer class_il")
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])

    def step(epoch: int, data: Mapping[str, Any]) -> torch.Tensor:
        loss = F.cross_entropy(model(data["a_hat"], data["x"], seen)[data["train_idx"]], data["y"])
        if data["anchors"]:
            loss = loss + cfg["ewc_strength"] * ewc_penalty(model, data["anchors"])
        return loss

    data = {"a_hat": a_hat, "x": x, "train_idx": train_idx, "y": y, "anchors": anchors}
    return fit_steps(step, data, [model], opt, cfg["epochs"], "class-IL", progress, engine, name)


def fisher_anchor(
    model: ClassIL, a_hat: torch.Tensor, x: torch.Tensor, train_idx: torch.Tensor, y: torch.Tensor, seen: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(Fisher diagonal, parameters) at the end of a task."""
    model.zero_grad()
    F.cross_entropy(model(a_hat, x, seen)[train_idx], y).backward()
    fisher = {n: p.grad.detach().pow(2).clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return fisher, {n: p.detach().clone() for n, p in model.named_parameters()}
