"""A numpy loop's checkpoint (README, "Long jobs resume"): for loops whose rule's env has no torch, so
`paperflow.core.loop.LoopCheckpoint` (torch.save) is not available. Kept apart from `paperflow.core.resume`, which
every resuming job imports and which stays free of numpy (the verl env has none)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from paperflow.core.resume import EVERY_S, Timer


class ArrayCheckpoint:
    """The state of a numpy loop (no torch: its rule's env may have none) in `<folder>/state.npz`: the next step,
    named arrays and JSON metadata (a numpy generator's `bit_generator.state`, counters), written aside and renamed,
    loaded without pickle:

        checkpoint = ArrayCheckpoint(job.checkpoint_dir() / "seed0")
        start, arrays, meta = checkpoint.restore()          # (0, {}, {}) when nothing was saved
        for n in range(start, steps):
            x = step(x)
            if checkpoint.due():
                checkpoint.save(n + 1, {"x": x}, {"rng": rng.bit_generator.state})
        checkpoint.save(steps, {"x": x}, {"rng": rng.bit_generator.state})   # a rerun loads the finished loop
    """

    FILE = "state.npz"

    def __init__(self, folder: str | Path, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.path = Path(folder) / self.FILE
        self.timer = Timer(every_s, clock)

    def restore(self) -> tuple[int, dict[str, Any], dict[str, Any]]:
        if not self.path.exists():
            return 0, {}, {}
        with np.load(self.path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != "__meta__"}
            meta = json.loads(str(data["__meta__"]))
        self.timer.saved()
        return int(meta.pop("__next_step__")), arrays, meta

    def due(self) -> bool:
        return self.timer.due()

    def save(self, next_step: int, arrays: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        if "__meta__" in arrays:
            raise ValueError("ArrayCheckpoint: '__meta__' is reserved")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, __meta__=np.array(json.dumps({**meta, "__next_step__": int(next_step)})), **arrays)
        os.replace(tmp, self.path)
        self.timer.saved()
