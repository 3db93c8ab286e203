"""The outer DRO loop (Alg. 2): per minibatch, sample the worst-case particles, then one optimiser
step on sum_j w_ij l(theta, z_ij), averaged over the batch.

Plain torch, not Lightning: the models are a 10-parameter vector, a 2-4-2 MLP or a linear head, and
the per-step work is the inner particle loop; Lightning's per-step overhead and import time would
dominate the smoke run (see the README).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm import tqdm

from paperflow.core.config import reject_unknown, require_keys
from paperflow.dro_flow.problems import Problem
from paperflow.dro_flow.samplers import SAMPLERS, SamplerConfig

log = logging.getLogger(__name__)


def sampler_config(dro: dict[str, Any]) -> SamplerConfig:
    """SamplerConfig from a dataset's `dro` config block; a missing or unknown key raises."""
    keys = [f.name for f in dataclasses.fields(SamplerConfig)]
    reject_unknown(dro, keys, "dro")
    require_keys(dro, keys, "dro")
    clamp = None if dro["clamp"] is None else tuple(dro["clamp"])
    return SamplerConfig(**{**dro, "clamp": clamp})


class PlainSGD:
    """p <- p - lr * grad, the update of torch.optim.SGD without momentum or weight decay (the same
    `p.add_(grad, alpha=-lr)`, so bit-identical to it), without torch.optim's first-use import of
    torch._dynamo: about 2 s of CPU per process, more than a ULS seed's whole training."""

    def __init__(self, params: Any, lr: float):
        self.params, self.lr = list(params), lr

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-self.lr)


def optimizer(model: nn.Module, train: dict[str, Any]) -> PlainSGD | torch.optim.Optimizer:
    if train["optimizer"] == "sgd":
        return PlainSGD(model.parameters(), lr=train["lr"])
    return torch.optim.Adam(model.parameters(), lr=train["lr"])


def batch_objective(
    problem: Problem,
    model: nn.Module,
    method: str,
    xb: torch.Tensor,
    yb: torch.Tensor,
    cfg: SamplerConfig | None,
    gen: torch.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss whose theta-gradient is the method's outer gradient, and the sampler's diagnostics
    (`cfg` is None for ERM, which samples nothing)."""
    x = xb[:, None, :]
    if method == "erm":
        return problem.loss(model, x, yb).mean(), {}
    parts = SAMPLERS[method](problem.energy(model, yb), x, cfg, gen)
    loss = problem.loss(model, parts.z.detach(), yb)
    return (parts.w.detach() * loss).sum(1).mean(), parts.info


def fit(
    problem: Problem, method: str, dro: dict[str, Any], train: dict[str, Any], seed: int
) -> tuple[nn.Module, pd.DataFrame]:
    """Train one model; returns it and its per-epoch history (mean outer loss, sampler diagnostics)."""
    model = problem.build(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = None if method == "erm" else sampler_config(dro)  # ERM uses no sampler (and gets no `dro` block)
    grad_scale = 1.0 if cfg is None else cfg.grad_scale
    if method == "erm" and problem.kind == "least_squares":
        model.erm_fit(problem.x.numpy())
        with torch.no_grad():
            value = float(problem.loss(model, problem.x[:, None, :], problem.y).mean())
        return model, pd.DataFrame([{"epoch": 0, "loss": value, "seconds": 0.0}])
    opt = optimizer(model, train)
    n, rows = len(problem.x), []
    for epoch in tqdm(range(train["epochs"]), desc=f"{method} seed {seed}", disable=None, mininterval=5):
        t0, losses, infos = time.perf_counter(), [], []
        order = torch.randperm(n, generator=gen) if train["shuffle"] else torch.arange(n)
        for start in range(0, n, train["batch_size"]):
            idx = order[start : start + train["batch_size"]]
            loss, info = batch_objective(problem, model, method, problem.x[idx], problem.y[idx], cfg, gen)
            opt.zero_grad()
            (loss * grad_scale).backward()
            nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
            opt.step()
            losses.append(float(loss.detach()))
            infos.append(info)
        row = {"epoch": epoch, "loss": float(np.mean(losses)), "seconds": time.perf_counter() - t0}
        for key in {k for i in infos for k in i}:
            row[key] = float(np.mean([i[key] for i in infos if key in i]))
        rows.append(row)
        if not math.isfinite(row["loss"]):
            raise FloatingPointError(f"{method} seed {seed}: non-finite training loss at epoch {epoch}")
    return model, pd.DataFrame(rows)
