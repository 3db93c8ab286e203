"""A model that does not fit one GPU, in one process: its layers spread over the job's GPUs by accelerate's
`device_map="auto"` under a memory cap per GPU (naive model parallelism: a forward, and a backward, run layer by
layer across the GPUs), with nothing allowed on the CPU or disk, where it would run, slowly and silently. Used for
the large VLMs of doubt and the OPT-30B/66B and first-order runs of lozo_plus; the job asks the scheduler for its
GPUs through the `train_node_gpu`-style resource classes (one node).

- `max_memory(gpus, per_gpu, key)`: accelerate's `max_memory` for cuda 0 .. gpus-1 (refusing a job that sees fewer);
- `check_placement(device_map, key)`: refuse a model that accelerate put partly on the CPU or disk;
- `load_sharded(auto_class, folder, dtype, memory, key)`: `from_pretrained` offline with both;
- `model_devices`, `peak_memory_total`, `reset_peak_memory_all`: the peak memory of a sharded run, summed over its
  GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from paperflow.core.config import ConfigError


def _gib(value: float | str) -> str:
    """A memory size as accelerate reads it: a number is GiB, a string keeps its unit ("70GiB")."""
    return value if isinstance(value, str) else f"{value:g}GiB"


def max_memory(
    gpus: int, per_gpu: float | str | None, key: str, device: str = "cuda", visible: int | None = None
) -> dict[Any, str]:
    """accelerate's `max_memory` for a job on `gpus` GPUs: `per_gpu` (GiB, or a string with its unit) on each of
    cuda 0 .. gpus-1 (None: each GPU's own size) and nothing on the CPU. `device: cpu` (offline tests) maps the
    whole model on the CPU. A job that sees fewer CUDA devices than `gpus` (`visible`, default what torch sees)
    is refused naming `key`."""
    if gpus < 1:
        raise ConfigError(f"{key} = {gpus}: a job needs at least one device")
    if device == "cpu":
        return {"cpu": "1024GiB" if per_gpu is None else f"{float(str(per_gpu).removesuffix('GiB')) * gpus:g}GiB"}
    visible = torch.cuda.device_count() if visible is None else visible
    if visible < gpus:
        raise ConfigError(
            f"{key} = {gpus} but this job sees {visible} CUDA device(s): run it where the rule's GPUs are given"
        )
    caps = {
        i: _gib(per_gpu) if per_gpu is not None else f"{torch.cuda.get_device_properties(i).total_memory // 2**30}GiB"
        for i in range(gpus)
    }
    return caps | {"cpu": "0GiB"}


def check_placement(
    device_map: Mapping[str, Any],
    key: str,
    allow_cpu: bool = False,
    hint: str = "give it more GPUs or a larger memory cap per GPU",
) -> None:
    """Refuse a sharded model that accelerate put partly on the disk, or on the CPU unless `allow_cpu` (the offline
    tests' CPU-only map): every module must sit on a GPU index. The error names `key` and ends with `hint`."""

    def on_gpu(d: Any) -> bool:
        return isinstance(d, int) or str(d).startswith("cuda") or (allow_cpu and str(d) == "cpu")

    off = sorted({str(d) for d in device_map.values() if not on_gpu(d)})
    if off:
        raise RuntimeError(f"{key}: the sharded model does not fit its GPUs (modules placed on {off}); {hint}")


def load_sharded(auto_class, folder: str, dtype: str, memory: Mapping[Any, str], key: str, **kwargs):
    """`auto_class.from_pretrained(folder)` offline in `dtype` with device_map "auto" under `memory`
    (`max_memory`'s output); a model placed partly off its GPUs is refused (`check_placement`)."""
    model = auto_class.from_pretrained(
        str(folder), local_files_only=True, dtype=getattr(torch, dtype), device_map="auto", max_memory=dict(memory),
        **kwargs,
    )  # fmt: skip
    check_placement(getattr(model, "hf_device_map", {}), key, allow_cpu=set(memory) == {"cpu"})
    return model


def model_devices(model) -> list[torch.device]:
    """The distinct devices of the model's parameters, the input embedding's first."""
    first = model.get_input_embeddings().weight.device
    rest = sorted({p.device for p in model.parameters()} - {first}, key=str)
    return [first, *rest]


def peak_memory_total(devices: Sequence[torch.device]) -> int | None:
    """torch.cuda.max_memory_allocated summed over the CUDA devices; None when there is none."""
    cuda = [d for d in devices if d.type == "cuda"]
    return sum(int(torch.cuda.max_memory_allocated(d)) for d in cuda) if cuda else None


def reset_peak_memory_all(devices: Sequence[torch.device]) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)
