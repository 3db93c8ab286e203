"""Paper-scale fits as Lightning jobs (`train.engine: lightning`; CONVENTIONS §6): a
`paperflow.core.training.StepModule` whose training step is one step of a safer fit (`paperflow.safer.fitting.Step`:
GRACE, one expert, one class-IL stage), fitted by `paperflow.core.training.fit_steps` (`accelerator="auto"`: a GPU
where the job has one; CSV logging always, wandb when enabled). The whole task graph is the batch; the steps draw
only from their own generators, and the optimizer is the one the plain loop would use, so on the CPU both engines
agree bit for bit. With the engine's `checkpoint_dir` each fit checkpoints into its own folder there
(`paperflow.core.training.fit_steps`) and a rerun resumes it. This module imports Lightning; only the lightning branch of `paperflow.safer.fitting.fit_steps`
imports it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from paperflow.core.training import StepModule, fit_steps
from paperflow.safer.fitting import Engine, Step


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


class _Losses:
    """The fit's losses so far, kept in its checkpoints (a resumed fit returns every epoch's loss)."""

    def __init__(self, losses: list[float]):
        self.losses = losses

    def state_dict(self) -> dict[str, list[float]]:
        return {"losses": list(self.losses)}

    def load_state_dict(self, state: dict[str, list[float]]) -> None:
        self.losses[:] = state["losses"]


def fit_lightning(
    step: Step,
    data: dict[str, Any],
    modules: list[nn.Module],
    opt: torch.optim.Optimizer,
    epochs: int,
    engine: Engine,
    name: str,
) -> list[float]:
    """The plain loop's `epochs` steps under a Trainer; the modules come back on the CPU in their own train/eval
    modes (the Trainer sets train mode), `data` is left as it was (the step reads a copy on the Trainer's device)."""
    modes = [[m.training for m in module.modules()] for module in modules]
    on_device = dict(data)
    losses: list[float] = []

    def move(device: torch.device) -> None:
        on_device.update(_to(data, device))

    def one_step(epoch: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = step(epoch, on_device)
        losses.append(float(loss))
        return loss, {"loss": loss.detach()}

    module = StepModule(one_step, modules, opt, on_device=move, state=_Losses(losses))
    folder = None if engine.checkpoint_dir is None else Path(engine.checkpoint_dir) / name
    fit_steps(
        module,
        epochs,
        checkpoint_dir=folder,
        run_dir=engine.run_dir,
        name=name,
        wandb=engine.wandb,
        tags=dict(engine.tags),
    )
    for m, flags in zip(modules, modes):
        m.to("cpu")
        for sub, flag in zip(m.modules(), flags):
            sub.training = flag
    return losses
