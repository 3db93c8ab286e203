"""Paper-scale training under Lightning Fabric (`train.engine: lightning`, conventions section 6: the loop is the
paper's own, sampler-driven DRO, so Fabric drives it rather than a LightningModule + Trainer).

Fabric (`paperflow.core.training.make_fabric`) places the model on the job's device (`accelerator="auto"`: the GPU where the job has one, one device),
back-propagates with `fabric.backward` and logs each epoch's row through its loggers (CSV always, wandb when
enabled; `paperflow.core.training.make_loggers`). The loop body is `paperflow.dro_flow.training.run_epochs`, the
one the plain engine runs: the same optimiser (`training.optimizer`), the same gradient clipping, the same CPU
generator for shuffling and the samplers (their draws move to the device), so on the CPU the two engines agree
bit for bit. Precision "32-true" converts nothing: the models keep their own dtype (float64 least squares,
float32 classifiers), as in the plain loop.

With the job's checkpoint folder the loop's state (model, optimiser, generators, the rows so far) is saved as the plain
loop saves it (`training.loop_checkpoint`), and a rerun continues from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from paperflow.core.training import finish_fabric, make_fabric, make_loggers
from paperflow.dro_flow.problems import Problem
from paperflow.dro_flow.samplers import SamplerConfig
from paperflow.dro_flow.training import loop_checkpoint, optimizer, run_epochs


def fit_fabric(
    problem: Problem,
    model: nn.Module,
    method: str,
    cfg: SamplerConfig | None,
    train: Mapping[str, Any],
    seed: int,
    gen: torch.Generator,
    run_dir: str | Path | None,
    wandb: Mapping[str, Any] | None,
    tags: dict[str, str],
    resume: tuple[Path, float] | None = None,
) -> tuple[nn.Module, pd.DataFrame]:
    """`model` (built by `problem.build(seed)`) trained by `run_epochs` under Fabric; returns it on the CPU and
    the history. Each epoch's row goes to run_dir/csv/seed<seed>/metrics.csv (no loggers when run_dir is None)."""
    loggers = [] if run_dir is None else make_loggers(run_dir, f"seed{seed}", wandb, tags)
    fabric = make_fabric(loggers)
    fabric.seed_everything(seed, verbose=False)  # python/numpy/torch; the fit itself draws from `gen` only
    wrapped = fabric.setup_module(model)
    opt = optimizer(wrapped, dict(train))
    if isinstance(opt, torch.optim.Optimizer):  # Adam; PlainSGD is no torch optimizer and steps as it is
        opt = fabric.setup_optimizers(opt)

    def log_row(row: dict[str, float]) -> None:
        epoch = int(row["epoch"])
        fabric.log_dict({f"train/{k}": v for k, v in row.items() if k != "epoch"} | {"epoch": epoch}, step=epoch)

    history = run_epochs(
        problem,
        wrapped,
        opt,
        method,
        cfg,
        dict(train),
        seed,
        gen,
        backward=fabric.backward,
        device=fabric.device,
        on_epoch=log_row,
        checkpoint=loop_checkpoint(resume, wrapped, opt, gen),
    )
    finish_fabric(fabric)
    return wrapped.module.to("cpu"), history
