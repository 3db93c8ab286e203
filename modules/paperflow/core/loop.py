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

A long loop resumes: `run_loop(..., checkpoint=LoopCheckpoint(job.checkpoint_dir(), {"model": model,
"optimizer": optimizer}))` saves the objects' state dicts, the records so far and the random generators' states
at least every 30 minutes, and a rerun continues from the saved step, ending where an uninterrupted run ends.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from paperflow.core.resume import EVERY_S, Timer
from paperflow.core.seeding import rng_states, set_rng_states

StepOutput = torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]


def _as_float(value: Any) -> float:
    return float(value.detach()) if isinstance(value, torch.Tensor) else float(value)


def optimizer_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter the optimizer updates, group by group (what Lightning's gradient clipping clips)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


class LoopCheckpoint:
    """The state of a `run_loop` in `<folder>/loop.pt`: the next step, the records so far, the state dicts of
    `objects` (model, optimizer, scheduler, anything with state_dict/load_state_dict) and the random generators'
    states, saved after a step when `every_s` seconds have passed (written aside, then renamed)."""

    FILE = "loop.pt"

    def __init__(
        self,
        folder: str | Path,
        objects: Mapping[str, Any],
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(folder) / self.FILE
        self.objects = dict(objects)
        self.timer = Timer(every_s, clock)

    def restore(self) -> tuple[int, list[dict[str, float]]]:
        """(first step to run, records so far), with the objects and generators set as saved; (0, []) if none."""
        if not self.path.exists():
            return 0, []
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        for name, obj in self.objects.items():
            obj.load_state_dict(state["objects"][name])
        set_rng_states(state["rng"])
        self.timer.saved()
        return int(state["next_step"]), list(state["records"])

    def step_done(self, step: int, records: list[dict[str, float]]) -> None:
        if self.timer.due():
            self.save(step + 1, records)

    def save(self, next_step: int, records: list[dict[str, float]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "next_step": next_step,
            "records": records,
            "objects": {name: obj.state_dict() for name, obj in self.objects.items()},
            "rng": rng_states(),
        }
        tmp = self.path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path)
        self.timer.saved()


class GeneratorState:
    """A private `torch.Generator` (a loop's shuffles or sampler draws) as an object `LoopCheckpoint` saves: the
    global generators are in every checkpoint, a loop's own are not unless it lists them."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"state": self.generator.get_state()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.generator.set_state(state["state"])


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
    checkpoint: LoopCheckpoint | None = None,
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
    checkpoint: resume from it and save into it (see LoopCheckpoint).
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
    start, records = checkpoint.restore() if checkpoint is not None else (0, [])
    for it in tqdm(range(start, int(steps)), desc=desc, disable=not show, mininterval=5, initial=start):
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
        if checkpoint is not None:
            checkpoint.step_done(it, records)
    return records
