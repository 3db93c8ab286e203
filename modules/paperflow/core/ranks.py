"""Decisions that every rank of a torch.distributed job must take alike (torchrun, Lightning DDP): rank 0 decides.

if agree(timer.due()):     # every rank saves at the same step, whatever its own clock says
    save()
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def agree(flag: bool) -> bool:
    """Rank 0's `flag` on every rank of the initialised process group; `flag` itself in a single process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([int(flag)], device=device)
    dist.broadcast(tensor, src=0)
    return bool(tensor.item())
