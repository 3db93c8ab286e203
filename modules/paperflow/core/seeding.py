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
from collections.abc import Mapping
from typing import Any

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


def rng_states() -> dict[str, Any]:
    """The states of the generators `seed_all` seeds, as tensors and plain values (a checkpoint holding them loads
    with torch's `weights_only`): a resumed run draws on where the saved one stopped."""
    import torch as torch_module

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, py_gauss = random.getstate()
    states: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss": py_gauss},
        "numpy": {
            "kind": kind,
            "keys": torch_module.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },  # fmt: skip
        "torch": torch_module.get_rng_state(),
    }
    if torch_module.cuda.is_available():
        states["torch.cuda"] = torch_module.cuda.get_rng_state_all()
    return states


def set_rng_states(states: Mapping[str, Any]) -> None:
    """Restore what `rng_states` took."""
    import torch as torch_module

    py, npy = states["python"], states["numpy"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["kind"], keys, npy["pos"], npy["has_gauss"], npy["gauss"]))
    torch_module.set_rng_state(states["torch"])
    if "torch.cuda" in states and torch_module.cuda.is_available():
        torch_module.cuda.set_rng_state_all(states["torch.cuda"])
