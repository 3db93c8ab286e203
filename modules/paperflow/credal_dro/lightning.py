"""Paper-scale training of the text heads under Lightning Fabric (`text.train.engine: lightning`).

The fit is the paper's own DRO loop (GroupDRO's exponentiated-gradient slice weights move before every step, and
LV-Group adds the closed-form sup over the bulk), so Fabric drives it (CONVENTIONS section 6; `paperflow.core.training.make_fabric`) rather than a
LightningModule + Trainer: the loop of `paperflow.credal_dro.heads.fit_loop`, step for step, on Fabric's device
(`accelerator="auto"`: a GPU where the job has one), float32 as the plain loop, backward through
`fabric.backward`, the objective of every step logged through the Fabric's loggers (CSV always, wandb when
enabled). One Fabric per seed drives that seed's grid values one after another (logged steps continue across
them, with the grid value as `param`). The plain loop does not checkpoint (a fit is seconds), so neither does
this one. On the CPU the two engines give the same heads bit for bit (tests check it).
"""

from __future__ import annotations

import torch
from lightning_fabric import Fabric


def fit_fabric(fabric: Fabric, head: torch.nn.Module, opt: torch.optim.Optimizer, epochs: int, step0: int) -> None:
    """`epochs` full-batch steps of `head` (a `heads.HeadObjective`) under `fabric`: the plain loop's steps, with
    the module and optimizer on Fabric's device and the objective logged at steps step0, step0 + 1, ..."""
    model, optimizer = fabric.setup(head, opt)
    for epoch in range(epochs):
        obj = model()
        optimizer.zero_grad()
        fabric.backward(obj)
        optimizer.step()
        fabric.log_dict({"objective": obj.detach(), "param": float(head.eps)}, step=step0 + epoch)
