"""Which torch device a job computes on, decided one way for every paper.

`pick("auto")` is CUDA when the job sees a GPU (SLURM's GRES sets CUDA_VISIBLE_DEVICES for a job that asked for
one) and the CPU otherwise; `"cpu"` forces the CPU; `"cuda"` / `"cuda:N"` insist on a GPU and fail, naming the
config key, where there is none, rather than running a paper-scale job on the CPU for days.
"""

from __future__ import annotations

import re

from paperflow.core.config import ConfigError

CHOICES = ("auto", "cpu", "cuda")
_CUDA = re.compile(r"^cuda(:\d+)?$")


def pick(name: str = "auto", key: str = "device"):
    """The torch.device for the config value `name` (one of auto, cpu, cuda, cuda:N), `key` naming it in errors."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if isinstance(name, str) and _CUDA.match(name):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"{key} = {name!r} but torch sees no CUDA device (torch {torch.__version__}); use 'auto' to fall "
                "back to the CPU, or run the job where a GPU is visible (a SLURM job that requests one)"
            )
        index = int(name.split(":")[1]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{key} = {name!r} but only {torch.cuda.device_count()} CUDA device(s) are visible")
        return torch.device(name)
    raise ConfigError(f"{key} = {name!r} is not a device; choose one of {', '.join(CHOICES)} (or cuda:N)")
