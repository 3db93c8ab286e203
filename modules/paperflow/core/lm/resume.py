"""Long transformers/TRL training jobs resume (see paperflow.core.resume for the folder).

    args = SFTConfig(output_dir=str(job.checkpoint_dir()), save_strategy="no", ...)
    trainer = SFTTrainer(model=model, args=args, ...)
    train(trainer)      # saves every 30 min, resumes from the newest complete checkpoint

transformers saves by steps or epochs only; `TimedSave` asks it for a checkpoint when `every_s` seconds have
passed since the last one (all ranks agree on the step). A checkpoint-<step> folder counts once `on_save` has
marked it complete; older ones are removed only then, so a kill mid-save leaves the previous one usable. The
Trainer's own resume (`resume_from_checkpoint`) restores weights, optimizer, scheduler, random number generators
and the data position, so a resumed deterministic run equals an uninterrupted one.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from paperflow.core.ranks import agree
from paperflow.core.resume import EVERY_S, Timer

log = logging.getLogger(__name__)

COMPLETE = "paperflow-complete"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """The complete checkpoint-<step> folders under `folder`, by step."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.match(p.name)) and p.is_dir()]
    return sorted((step, p) for step, p in found if (p / COMPLETE).exists())


def last_checkpoint(folder: str | Path) -> str | None:
    """The newest complete checkpoint under `folder`, for `trainer.train(resume_from_checkpoint=...)`."""
    done = checkpoints(folder)
    return str(done[-1][1]) if done else None


class TimedSave(TrainerCallback):
    """Asks the Trainer to save after a step when `every_s` seconds have passed since the last save; marks each
    saved checkpoint complete and then removes the older ones and any incomplete leftovers."""

    def __init__(self, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self.timer = Timer(every_s, clock)

    def on_train_begin(self, args, state, control, **kwargs):
        self.timer = Timer(self.every_s, self.clock)

    def on_step_end(self, args, state, control, **kwargs):
        if agree(self.timer.due()):
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.timer.saved()
        if state.is_world_process_zero:
            folder = Path(args.output_dir)
            newest = folder / f"checkpoint-{state.global_step}"
            (newest / COMPLETE).write_text(f"step {state.global_step}\n")
            for p in folder.iterdir():
                if _CHECKPOINT.match(p.name) and p != newest:
                    shutil.rmtree(p, ignore_errors=True)
            log.info("checkpoint %s", newest)
        return control


def train(trainer: Any, every_s: float = EVERY_S, **train_kwargs: Any) -> Any:
    """`trainer.train()` with a checkpoint at least every `every_s` seconds into the trainer's output_dir (the job's
    checkpoint folder), resuming from the newest complete one there."""
    folder = Path(trainer.args.output_dir)
    if trainer.args.save_total_limit is not None:
        raise ValueError("train: leave save_total_limit unset; TimedSave keeps the newest complete checkpoint")
    trainer.add_callback(TimedSave(every_s))
    resume = last_checkpoint(folder)
    if resume:
        log.info("resuming from %s", resume)
    return trainer.train(resume_from_checkpoint=resume, **train_kwargs)
