"""How a training job starts its processes: one Python process, or one per GPU of its node under
torchrun (the rule's resource class `train_node_gpu` gives the job the node's GPUs as one SLURM task;
torchrun then sets RANK, LOCAL_RANK and WORLD_SIZE for each process, which `accelerate`, TRL and
Lightning read)."""

from __future__ import annotations

import shlex


def launch_command(n_procs: int, python: str = "python") -> str:
    """The shell prefix before `-m module args`: `python` for one process, else
    `python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=N` (torchrun, single node).
    `python` is resolved in the job's environment (its conda env on a cluster), not the submitting one."""
    if n_procs < 1:
        raise ValueError(f"a job needs at least one process, got {n_procs}")
    python = shlex.quote(python)
    if n_procs == 1:
        return python
    return f"{python} -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node={n_procs}"
