"""Models that do not fit one GPU (OPT-30B/66B for the ZO methods, the first-order reference at 13B): one process,
the model's layers spread over the job's GPUs by accelerate's device_map "auto" with a memory cap per GPU
(naive model parallelism: forwards, and the FO backward, run layer by layer across the GPUs; the kit's
`paperflow.core.lm.sharding`). ZO needs forwards only, so this is all it needs; the ZO noise is drawn from one
stream and moved to each parameter's GPU (zo.ZeroOrder.randn), so a sharded run takes an unsharded run's directions.

The GPU count of a train job comes from the config per (model, method): `resources.train_gpus_by_model`, keyed by
the pretrained model's Hub name (`gpus_for`); the workflow passes it to the job and asks the scheduler for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paperflow.core.config import ConfigError

ZO_METHODS = ("mezo", "lozo", "lozom", "lozoplus", "lozoplus_random")


def gpus_for(resources: Mapping[str, Any], hub: str, method: str, stage: str = "train") -> int:
    """GPUs of one job of `method` on model `hub`: `train_gpus_by_model[hub][method]` for training; evaluation runs
    the model in its (half-precision) inference dtype, so it takes the ZO methods' count (their largest). Without a
    `train_gpus_by_model` entry for the model, `resources.gpus`."""
    table = resources.get("train_gpus_by_model") or {}
    if hub not in table:
        return int(resources["gpus"])
    counts = table[hub]
    if stage == "evaluate":
        zo = [int(v) for k, v in counts.items() if k in ZO_METHODS]
        return max(zo) if zo else int(resources["gpus"])
    if method not in counts:
        raise ConfigError(
            f"resources.train_gpus_by_model.{hub} gives no GPU count for method {method!r} "
            f"(has {sorted(counts)}): add it, or drop the method"
        )
    return int(counts[method])


def load_sharded(info: Mapping[str, Any], dtype: str, memory: Mapping[Any, str], key: str = "pretrained"):
    """The pretrained model of `info` (download_model's JSON: hub, revision, folder), pinned, loaded offline by the
    kit's `sharding.load_sharded` (device_map "auto" under `memory`; a model that does not fit is refused)."""
    from transformers import AutoModelForCausalLM

    from paperflow.core.lm import sharding
    from paperflow.core.lm.models import require_pinned

    require_pinned(info["hub"], info["revision"])
    return sharding.load_sharded(AutoModelForCausalLM, info["folder"], dtype, memory, key)
