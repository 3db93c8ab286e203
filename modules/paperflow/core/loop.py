"""The plain training loop: the engine beside Lightning where a fit lasts seconds and Lightning's import
and per-step hooks would dominate (conventions section 6), or where the data is not a DataLoader.

    rows = run_loop(task.loss, optimizer, steps=300, grad_clip=1.0, desc="seed 0")
    rows[-1]  # {"step": 299, "loss": 0.41, ...}: the loss and the step's logs of every iteration

`step(i)` does iteration i's work (draw a batch, sample trajectories, run the whole graph) and returns
the loss to minimise, a scalar tensor, or `(loss, logs)` with logs a mapping of names to scalar tensors
or numbers recorded beside it. The loop knows nothing of epochs, data loaders or models: what an
iteration is belongs to the step. Each iteration runs, in this order (Lightning's automatic
optimisation, so that a Lightning module around the same step function takes the same steps):

    loss = step(i); optimizer.zero_grad(); loss.backward(); clip (if grad_clip); optimizer.step();
    scheduler.step() (if a scheduler); record

With `optimizer=None` the loop is in manual mode: the step makes its own updates (zeroth-order steps, two
optimisers, PPO mini-batches) and returns the value to record as its loss (a number or a tensor, never
backpropagated here); the loop keeps the records, the progress bar and `on_step`. Clipping and a scheduler
belong to such a step, and are refused here.

The progress bar (tqdm) shows on a terminal only, unless `progress` says otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from tqdm import tqdm

StepOutput = torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]


def _as_float(value: Any) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def optimizer_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter the optimizer updates, group by group (what Lightning's gradient clipping clips)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def run_loop(
    step: Callable[[int], StepOutput],
    optimizer: torch.optim.Optimizer | None,
    steps: int,
    *,
    grad_clip: float | None = None,
    clip_parameters: Iterable[torch.Tensor] | None = None,
    scheduler: Any | None = None,
    deterministic: bool = False,
    desc: str = "train",
    progress: bool | None = None,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Minimise `step(i)` for i = 0 .. steps-1; returns one record per iteration: `step`, `loss` and the
    step's logs as floats (a log named `loss` is recorded in the loss's place).

    grad_clip: clip the total gradient norm (2-norm) to this before each optimizer step, over
        `clip_parameters` (default: the optimizer's parameters); None leaves gradients as they are.
    scheduler: a learning-rate scheduler stepped after every optimizer step.
    deterministic: `torch.use_deterministic_algorithms(True, warn_only=True)` first, as a Lightning
        Trainer with `deterministic="warn"`.
    progress: show the bar (True), hide it (False), or show it when stderr is a terminal (None).
    on_step: called with each iteration's record once it is taken (evaluation, checkpoints, early logs).
    optimizer None: manual mode (see the module's docstring).
    """
    manual = optimizer is None
    if manual and (grad_clip is not None or scheduler is not None):
        given = [n for n, v in (("grad_clip", grad_clip), ("scheduler", scheduler)) if v is not None]
        raise ValueError(
            f"run_loop without an optimizer (manual mode) got {', '.join(given)}: a manual step clips and "
            "schedules its own updates"
        )
    if grad_clip is not None and not grad_clip > 0:
        raise ValueError(f"grad_clip = {grad_clip!r}: must be a positive norm, or None for no clipping")
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    clipped = None
    if grad_clip is not None:
        clipped = list(clip_parameters) if clip_parameters is not None else optimizer_parameters(optimizer)
    show = sys.stderr.isatty() if progress is None else progress
    records = []
    for it in tqdm(range(int(steps)), desc=desc, disable=not show, mininterval=5):
        out = step(it)
        loss, logs = out if isinstance(out, tuple) else (out, {})
        if not manual:
            optimizer.zero_grad()
            loss.backward()
            if clipped is not None:
                torch.nn.utils.clip_grad_norm_(clipped, grad_clip)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        record = {"step": it, "loss": _as_float(loss), **{k: _as_float(v) for k, v in logs.items()}}
        records.append(record)
        if on_step is not None:
            on_step(record)
    return records
