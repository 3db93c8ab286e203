"""Paper-scale training under Lightning Fabric (`train.engine: lightning`; CONVENTIONS §6). The federated rounds are
the paper's own loop (local SGD on all clients' stacked states, then fusion, then the phase control), so Fabric
drives that loop rather than a Trainer (`paperflow.core.training.make_fabric`): the device is the Fabric's (`train.device` as its accelerator, `auto` by
default: a GPU where the job has one), the gradients of each local step come from `fabric.backward`, the evaluated
rounds go to the Fabric's loggers (CSV always, wandb when enabled), the seeds are set by `fabric.seed_everything`,
and the final checkpoint is written by `fabric.save`. The arithmetic is the plain loop's
(`paperflow.decfus.clients.local_round`): float32 throughout ("32-true"), the same seeds and batch plans, and
`fabric.backward(loss, inputs=...)` fills the same gradients that `torch.autograd.grad` returns, so on the CPU
the two engines agree bit for bit (tests/papers/test_decfus.py). This module imports Lightning; only the
Fabric branch of `paperflow.decfus.training` imports it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightning_fabric import Fabric

from paperflow.decfus.clients import GradFn


def fabric_grad(fabric: Fabric) -> GradFn:
    """`torch.autograd.grad(loss, tensors)` through `fabric.backward`: the gradients land in the tensors' `.grad`
    (only theirs: `inputs=`), are taken out and cleared, so no step accumulates into the next."""

    def grad(loss: torch.Tensor, tensors: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        fabric.backward(loss, inputs=tensors)
        grads = [t.grad for t in tensors]
        for t in tensors:
            t.grad = None
        return grads

    return grad
