"""The outer DRO loop (Alg. 2): per minibatch, sample the worst-case particles, then one optimiser
step on sum_j w_ij l(theta, z_ij), averaged over the batch.

The loop is the paper's own (the sampler runs inside every step), so two engines drive the one loop
body `run_epochs` (`train.engine`):
- `loop` (tiny, smoke, cpu): plain torch on the CPU. The models are a 10-parameter vector, a 2-4-2 MLP
  or a linear head, and the per-step work is the inner particle loop; importing Lightning Fabric costs
  about 4-6 s of CPU per job, which the smoke budget (CI's 120 s on 2 cores) does not leave.
- `lightning` (paper scale): `paperflow.dro_flow.fabric`, Lightning Fabric on the job's device
  (`accelerator="auto"`), with `fabric.backward` and CSV logging (wandb when enabled) through Fabric's
  loggers; imported only on that branch.
Both take the same steps in the same order from the same random streams; on the CPU they agree bit for
bit (tests check it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm import tqdm

from paperflow.core.config import reject_unknown, require_keys
from paperflow.core.loop import GeneratorState, LoopCheckpoint
from paperflow.core.resume import EVERY_S
from paperflow.dro_flow.problems import Problem
from paperflow.dro_flow.samplers import SAMPLERS, SamplerConfig

log = logging.getLogger(__name__)

ENGINES = ("loop", "lightning")


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

    def state_dict(self) -> dict[str, Any]:  # no state: plain SGD (for LoopCheckpoint)
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


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
    problem: Problem,
    method: str,
    dro: dict[str, Any],
    train: dict[str, Any],
    seed: int,
    run_dir: str | Path | None = None,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
) -> tuple[nn.Module, pd.DataFrame]:
    """Train one model with `train["engine"]`; returns it (on the CPU) and its per-epoch history (mean outer
    loss, sampler diagnostics). The lightning engine (Fabric) logs each epoch to run_dir/csv/seed<seed>/metrics.csv
    (nothing when run_dir is None) and to wandb when `wandb` enables it; the loop engine logs nothing.
    With `checkpoint_dir` (this fit's folder under the job's checkpoint_dir()), either engine saves the loop's
    state there every `checkpoint_every_s` at most and at the end, and a rerun continues from it (`run_epochs`)."""
    engine = train["engine"]
    if engine not in ENGINES:
        raise ValueError(f"train.engine = {engine!r}: not one of {ENGINES}")
    model = problem.build(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = None if method == "erm" else sampler_config(dro)  # ERM uses no sampler (and gets no `dro` block)
    if method == "erm" and problem.kind == "least_squares":  # closed form, not gradient training: no engine
        model.erm_fit(problem.x.numpy())
        with torch.no_grad():
            value = float(problem.loss(model, problem.x[:, None, :], problem.y).mean())
        return model, pd.DataFrame([{"epoch": 0, "loss": value, "seconds": 0.0}])
    resume = None if checkpoint_dir is None else (Path(checkpoint_dir), checkpoint_every_s)
    if engine == "loop":
        opt = optimizer(model, train)
        return model, run_epochs(
            problem, model, opt, method, cfg, train, seed, gen, checkpoint=loop_checkpoint(resume, model, opt, gen)
        )
    from paperflow.dro_flow.fabric import fit_fabric

    return fit_fabric(problem, model, method, cfg, train, seed, gen, run_dir, wandb, tags or {}, resume)


def loop_checkpoint(
    resume: tuple[Path, float] | None, model: nn.Module, opt: Any, gen: torch.Generator
) -> LoopCheckpoint | None:
    """What a fit saves to resume (None: nothing): the model, the optimiser, the shuffles' and samplers'
    generator (and, as every LoopCheckpoint, the global generators and the epoch rows so far)."""
    if resume is None:
        return None
    folder, every_s = resume
    return LoopCheckpoint(folder, {"model": model, "optimizer": opt, "gen": GeneratorState(gen)}, every_s)


def run_epochs(
    problem: Problem,
    model: nn.Module,
    opt: Any,
    method: str,
    cfg: SamplerConfig | None,
    train: dict[str, Any],
    seed: int,
    gen: torch.Generator,
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward,
    device: torch.device | None = None,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    checkpoint: LoopCheckpoint | None = None,
) -> pd.DataFrame:
    """The loop body both engines run. The engine gives `backward` (plain: Tensor.backward), the `device`
    the minibatches move to (None: they stay where the data are, the CPU) and `on_epoch` (each epoch's row,
    for its loggers). Shuffling and the samplers draw from the CPU generator `gen` on every device.
    `checkpoint` (`loop_checkpoint`): the epochs it holds are restored (their rows given to `on_epoch` again, so
    a fresh log is whole), each later epoch may save, and the last one does."""
    grad_scale = 1.0 if cfg is None else cfg.grad_scale
    n, rows = len(problem.x), []
    start = 0
    if checkpoint is not None:
        start, rows = checkpoint.restore()
        for row in rows:
            if on_epoch is not None:
                on_epoch(row)
    epochs = range(start, train["epochs"])
    for epoch in tqdm(epochs, desc=f"{method} seed {seed}", disable=None, mininterval=5, initial=start):
        t0, losses, infos = time.perf_counter(), [], []
        order = torch.randperm(n, generator=gen) if train["shuffle"] else torch.arange(n)
        for start in range(0, n, train["batch_size"]):
            idx = order[start : start + train["batch_size"]]
            xb, yb = problem.x[idx], problem.y[idx]
            if device is not None:
                xb, yb = xb.to(device), yb.to(device)
            loss, info = batch_objective(problem, model, method, xb, yb, cfg, gen)
            opt.zero_grad()
            backward(loss * grad_scale)
            nn.utils.clip_grad_norm_(model.parameters(), train["grad_clip"])
            opt.step()
            losses.append(float(loss.detach()))
            infos.append(info)
        row = {"epoch": epoch, "loss": float(np.mean(losses)), "seconds": time.perf_counter() - t0}
        for key in {k for i in infos for k in i}:
            row[key] = float(np.mean([i[key] for i in infos if key in i]))
        rows.append(row)
        if on_epoch is not None:
            on_epoch(row)
        if not math.isfinite(row["loss"]):
            raise FloatingPointError(f"{method} seed {seed}: non-finite training loss at epoch {epoch}")
        if checkpoint is not None:
            checkpoint.step_done(epoch, rows)
    if checkpoint is not None and start < train["epochs"]:
        checkpoint.save(train["epochs"], rows)  # a rerun of the job loads this seed's fit instead of refitting
    return pd.DataFrame(rows)
