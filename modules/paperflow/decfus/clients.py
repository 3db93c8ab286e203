"""Local training of all m clients at once, on stacked states (`name -> (m, *shape)` tensors).

Two backends compute the clients' losses; the optimiser step is shared:
- `BatchedMLP`: the smoke MLP as batched matrix products (`torch.baddbmm`), all clients in one
  forward/backward per step (clients with fewer batches are masked out of the step);
- `ModuleClients`: any `nn.Module` (VGG16-BN, ResNet) through `torch.func.functional_call` on each
  client's slice, still one backward per step; BatchNorm running statistics update in place in the
  client's slice.
Both reproduce a fresh `torch.optim.SGD(lr, momentum)` per client per round (momentum buffers reset
every round, dampening 0), which tests/papers/test_decfus.py checks against torch's own optimiser.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from paperflow.decfus.fusion import States, fused_keys

Plan = list[list[torch.Tensor]]  # plan[i][s]: global row indices of client i's batch at step s
# (loss, tensors) -> d loss / d tensors: torch.autograd.grad in the plain loop, fabric.backward under Fabric
GradFn = Callable[[torch.Tensor, list[torch.Tensor]], Sequence[torch.Tensor]]


def stack_states(net: nn.Module, m: int, device: torch.device | str = "cpu") -> States:
    """m identical copies of the network's state (the code starts every client from the same weights)."""
    return {
        k: v.detach().to(device).unsqueeze(0).repeat(m, *([1] * v.dim())).contiguous()
        for k, v in net.state_dict().items()
    }


def client_state(states: States, i: int) -> dict[str, torch.Tensor]:
    return {k: v[i] for k, v in states.items()}


def batch_plan(
    parts: Sequence[np.ndarray],
    batch_size: int,
    epochs: int,
    rng: np.random.Generator,
    device: torch.device | str = "cpu",
) -> Plan:
    """Each client's shuffled mini-batches for one round: `epochs` passes, a fresh permutation each
    (the DataLoader's shuffle=True); the last batch of a pass may be short."""
    plan: Plan = []
    for idx in parts:
        batches = []
        for _ in range(epochs):
            perm = rng.permutation(np.asarray(idx))
            batches += [
                torch.as_tensor(perm[s : s + batch_size], device=device) for s in range(0, len(perm), batch_size)
            ]
        plan.append(batches)
    return plan


class ModuleClients:
    """Clients of any torch module, each evaluated on its own slice of the stacked state."""

    def __init__(self, net: nn.Module):
        self.net = net
        self.trainable = [name for name, _ in net.named_parameters()]

    def client_logits(self, states: States, i: int, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        self.net.train(train)
        return functional_call(self.net, client_state(states, i), (x,))

    def loss_sum(self, states: States, batches: Sequence[tuple[torch.Tensor, torch.Tensor] | None]) -> torch.Tensor:
        """Σ_i mean cross-entropy of client i on its batch (None: client i sits this step out)."""
        total = 0.0
        for i, batch in enumerate(batches):
            if batch is not None:
                total = total + F.cross_entropy(self.client_logits(states, i, batch[0], train=True), batch[1])
        return total

    @torch.no_grad()
    def all_logits(self, states: States, x: torch.Tensor, batch_size: int) -> torch.Tensor:
        m = next(iter(states.values())).shape[0]
        return torch.stack(
            [
                torch.cat([self.client_logits(states, i, x[s : s + batch_size]) for s in range(0, len(x), batch_size)])
                for i in range(m)
            ]
        )


class BatchedMLP(ModuleClients):
    """The Linear-ReLU MLP of nets.mlp with every client in one batched matmul per layer."""

    def __init__(self, net: nn.Sequential):
        super().__init__(net)
        self.layers = [str(i) for i, layer in enumerate(net) if isinstance(layer, nn.Linear)]
        if any(not isinstance(layer, (nn.Linear, nn.ReLU)) for layer in net):
            raise ValueError("BatchedMLP needs a Sequential of Linear and ReLU layers")

    def forward(self, states: States, x: torch.Tensor) -> torch.Tensor:
        """x: (m, B, d) -> logits (m, B, classes)."""
        h = x
        for n, name in enumerate(self.layers):
            h = torch.baddbmm(states[f"{name}.bias"].unsqueeze(1), h, states[f"{name}.weight"].transpose(1, 2))
            if n < len(self.layers) - 1:
                h = torch.relu(h)
        return h

    def client_logits(self, states: States, i: int, x: torch.Tensor, train: bool = False) -> torch.Tensor:
        return self.forward({k: v[i : i + 1] for k, v in states.items()}, x.unsqueeze(0))[0]

    def loss_sum(self, states: States, batches: Sequence[tuple[torch.Tensor, torch.Tensor] | None]) -> torch.Tensor:
        width = max(len(b[1]) for b in batches if b is not None)
        ref = next(b for b in batches if b is not None)
        m = len(batches)
        x = ref[0].new_zeros((m, width, *ref[0].shape[1:]))
        y = ref[1].new_zeros((m, width))
        mask = ref[0].new_zeros((m, width))
        for i, batch in enumerate(batches):
            if batch is not None:
                k = len(batch[1])
                x[i, :k], y[i, :k], mask[i, :k] = batch[0], batch[1], 1.0
        logits = self.forward(states, x)
        ce = F.cross_entropy(logits.reshape(m * width, -1), y.reshape(-1), reduction="none").view(m, width)
        return ((ce * mask).sum(1) / mask.sum(1).clamp_min(1.0)).sum()

    @torch.no_grad()
    def all_logits(self, states: States, x: torch.Tensor, batch_size: int) -> torch.Tensor:
        m = next(iter(states.values())).shape[0]
        return torch.cat(
            [
                self.forward(states, x[s : s + batch_size].unsqueeze(0).expand(m, -1, -1))
                for s in range(0, len(x), batch_size)
            ],
            dim=1,
        )


def make_clients(net: nn.Module, backend: str) -> ModuleClients:
    if backend == "batched":
        return BatchedMLP(net)
    if backend == "looped":
        return ModuleClients(net)
    raise ValueError(f"unknown train.backend {backend!r}; known: batched, looped")


def local_round(
    clients: ModuleClients,
    states: States,
    x: torch.Tensor,
    y: torch.Tensor,
    plan: Plan,
    lr: float,
    momentum: float,
    gossip: np.ndarray | None = None,
    grad: GradFn = torch.autograd.grad,
) -> States:
    """One round of local SGD for every client from `states`; a fresh momentum buffer per client.
    With `gossip` (D-PSGD) the fused tensors are mixed by that matrix after every step. `grad` computes the
    step's gradients (paperflow.decfus.lightning.fabric_grad under the Fabric engine; the same numbers)."""
    trainable = set(clients.trainable)
    work = {k: v.detach().clone().requires_grad_(k in trainable) for k, v in states.items()}
    params = [k for k in clients.trainable]
    buffers = {k: torch.zeros_like(work[k]) for k in params}
    mix_keys = fused_keys(work)
    w = (
        None
        if gossip is None
        else torch.as_tensor(gossip, dtype=work[mix_keys[0]].dtype, device=work[mix_keys[0]].device)
    )
    for step in range(max(len(p) for p in plan)):
        active = [step < len(p) for p in plan]
        batches = [(x[p[step]], y[p[step]]) if a else None for p, a in zip(plan, active)]
        grads = grad(clients.loss_sum(work, batches), [work[k] for k in params])
        mask = torch.tensor(active, device=x.device)
        with torch.no_grad():
            for k, g in zip(params, grads):
                on = mask.view(-1, *([1] * (g.dim() - 1)))
                buffers[k] = torch.where(on, momentum * buffers[k] + g, buffers[k])
                work[k].sub_(lr * buffers[k] * on)
            if w is not None:
                for k in mix_keys:
                    work[k].copy_(torch.einsum("ij,j...->i...", w, work[k]))
    return {k: v.detach() for k, v in work.items()}


@torch.no_grad()
def test_metrics(
    clients: ModuleClients, states: States, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-client accuracy and mean cross-entropy on (x, y)."""
    logits = clients.all_logits(states, x, batch_size)
    m = logits.shape[0]
    acc = (logits.argmax(-1) == y.unsqueeze(0)).double().mean(1)
    loss = (
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.repeat(m), reduction="none")
        .view(m, -1)
        .double()
        .mean(1)
    )
    return acc.cpu().numpy(), loss.cpu().numpy()


@torch.no_grad()
def local_losses(
    clients: ModuleClients,
    states: States,
    x: torch.Tensor,
    y: torch.Tensor,
    parts: Sequence[np.ndarray],
    batch_size: int,
) -> np.ndarray:
    """L_j: mean cross-entropy of client j's model on its own training data (eval mode)."""
    out = []
    for i, idx in enumerate(parts):
        rows = torch.as_tensor(np.asarray(idx), device=x.device)
        ce = [
            F.cross_entropy(
                clients.client_logits(states, i, x[rows[s : s + batch_size]]),
                y[rows[s : s + batch_size]],
                reduction="sum",
            )
            for s in range(0, len(rows), batch_size)
        ]
        out.append(float(sum(ce)) / len(rows))
    return np.asarray(out)
