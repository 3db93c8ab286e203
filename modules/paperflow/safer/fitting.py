"""The two engines of safer's gradient fits (`train.engine`): each fit (GRACE pretraining, one expert, one
class-IL stage) is a `step(epoch, data) -> loss` closure plus its Adam optimizer, and

- `loop` (tiny, smoke, cpu): the plain loop `paperflow.core.loop.run_loop`: step, zero_grad, backward, Adam
  step, record the loss;
- `lightning` (paper): `paperflow.safer.lightning`, a LightningModule whose training_step is that step, fitted by
  `paperflow.core.training.make_trainer` on the job's device (the module imports Lightning, so it is imported
  only in that branch).

`data` holds the fit's tensors (the loop passes them as they are; Lightning moves them to its device first), and
the closures draw only from their own generators, so both engines run the same arithmetic: on the CPU they give the
same weights and losses bit for bit (tests/papers/test_safer.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from paperflow.core.loop import run_loop

ENGINES = ("loop", "lightning")
Step = Callable[[int, Mapping[str, Any]], torch.Tensor]


@dataclass(frozen=True)
class Engine:
    """`train.engine` and, for `lightning`, where its loggers write (run_dir/csv/<fit name>, wandb when enabled) and
    where its fits checkpoint (`checkpoint_dir`/<fit name>: the job's `checkpoint_dir()`; a rerun of a killed job
    resumes the fit it was in and loads the finished ones)."""

    name: str = "loop"
    run_dir: str | Path | None = None
    wandb: Mapping[str, Any] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    checkpoint_dir: str | Path | None = None

    def __post_init__(self) -> None:
        if self.name not in ENGINES:
            raise ValueError(f"train.engine = {self.name!r}: not one of {ENGINES}")
        if self.name == "lightning" and self.run_dir is None:
            raise ValueError("train.engine = 'lightning' needs a run_dir for its loggers")
        if self.name == "loop" and self.checkpoint_dir is not None:
            raise ValueError("train.engine = 'loop' takes no checkpoint_dir: the plain loop's fits do not checkpoint")


LOOP = Engine()


def fit_steps(
    step: Step,
    data: dict[str, Any],
    modules: list[nn.Module],
    opt: torch.optim.Optimizer,
    epochs: int,
    desc: str,
    progress: bool,
    engine: Engine,
    name: str,
) -> list[float]:
    """`epochs` full-batch steps of `step` with `opt` over the parameters of `modules`; the loss of each epoch.
    `modules` (trained and frozen ones) and `data` are what the Lightning engine moves to its device."""
    if engine.name == "loop":
        return [r["loss"] for r in run_loop(lambda epoch: step(epoch, data), opt, epochs, desc=desc, progress=progress)]
    from paperflow.safer.lightning import fit_lightning

    return fit_lightning(step, data, modules, opt, epochs, engine, name)
