"""One light seeding helper for every paper: the generators `pytorch_lightning.seed_everything` seeds
(python's `random`, numpy's global state, torch's CPU and CUDA generators), without importing Lightning.

A plain-loop engine and a Lightning engine that both seed through their own helper draw the same
numbers, so the two can be tested equal. torch is seeded only where it is installed, so a paper without
torch (an LP, a sampler in numpy) can call this too.
"""

from __future__ import annotations

import importlib.util
import random
import sys

import numpy as np


def torch_installed() -> bool:
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def seed_all(seed: int, *, torch: bool | None = None) -> int:
    """Seed python, numpy and torch with `seed`; returns it. `torch`: seed torch (True), skip it (False),
    or seed it where it is installed (None, the default)."""
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed)
    if torch if torch is not None else torch_installed():
        import torch as torch_module

        torch_module.manual_seed(seed)  # every device's generator, CUDA included
    return seed
