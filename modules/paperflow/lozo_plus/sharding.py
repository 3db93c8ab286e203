"""Models that do not fit one GPU (OPT-30B/66B for the ZO methods, the first-order reference at 13B): one process,
the model's layers spread over the job's GPUs by accelerate's device_map "auto" with a memory cap per GPU
(naive model parallelism: forwards, and the FO backward, run layer by layer across the GPUs). ZO needs forwards
only, so this is all it needs; the ZO noise is drawn from one stream and moved to each parameter's GPU
(zo.ZeroOrder.randn), so a sharded run takes an unsharded run's directions.

The GPU count of a train job comes from the config per (model, method): `resources.train_gpus_by_model`, keyed by
the pretrained model's Hub name (`gpus_for`); the workflow passes it to the job and asks the scheduler for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from paperflow.core.config import ConfigError

if TYPE_CHECKING:
    import torch

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


def max_memory(gpus: int, device: str, per_gpu_gib: float | None, key: str = "gpus") -> dict[Any, str]:
    """accelerate's `max_memory` for a job on `gpus` GPUs: `per_gpu_gib` GiB on each of cuda 0 .. gpus-1 (None: no
    cap, the GPUs' sizes) and nothing on the CPU (no silent offload). `device: cpu` (the offline tests) maps the
    whole model on the CPU. A job that sees fewer GPUs than it asked for fails naming `key`."""
    import torch

    if gpus < 1:
        raise ConfigError(f"{key} = {gpus}: a job needs at least one device")
    if device == "cpu":
        return {"cpu": f"{per_gpu_gib * gpus}GiB" if per_gpu_gib else "1024GiB"}
    visible = torch.cuda.device_count()
    if visible < gpus:
        raise ConfigError(
            f"{key} = {gpus} but torch sees {visible} CUDA device(s); run the job where {gpus} are visible"
        )
    cap = f"{per_gpu_gib}GiB" if per_gpu_gib else None
    return {i: cap or f"{torch.cuda.get_device_properties(i).total_memory // 2**30}GiB" for i in range(gpus)} | {
        "cpu": "0GiB"
    }


def load_sharded(info: Mapping[str, Any], dtype: str, memory: Mapping[Any, str]):
    """The pretrained model of `info` (download_model's JSON: hub, revision, folder) loaded offline with
    device_map "auto" under `memory`; a model that does not fit is refused (no disk or CPU offload)."""
    import torch
    from transformers import AutoModelForCausalLM

    from paperflow.core.lm.models import require_pinned

    require_pinned(info["hub"], info["revision"])
    model = AutoModelForCausalLM.from_pretrained(
        str(info["folder"]),
        local_files_only=True,
        dtype=getattr(torch, dtype),
        device_map="auto",
        max_memory=dict(memory),
    )
    placed = set(getattr(model, "hf_device_map", {}).values())
    if "disk" in placed or ("cpu" in placed and set(memory) != {"cpu"}):
        raise ConfigError(f"the model does not fit max_memory {dict(memory)}: placed on {sorted(map(str, placed))}")
    return model


def model_devices(model) -> list[torch.device]:
    """The distinct devices of the model's parameters, the input embedding's first."""
    first = model.get_input_embeddings().weight.device
    rest = sorted({p.device for p in model.parameters()} - {first}, key=str)
    return [first, *rest]


def peak_memory_total(devices: Sequence[torch.device]) -> int | None:
    """torch.cuda.max_memory_allocated summed over the CUDA devices (spec 8 for a sharded model); None when the
    model is on none."""
    import torch

    cuda = [d for d in devices if d.type == "cuda"]
    return sum(int(torch.cuda.max_memory_allocated(d)) for d in cuda) if cuda else None


def reset_peak_memory_all(devices: Sequence[torch.device]) -> None:
    import torch

    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
