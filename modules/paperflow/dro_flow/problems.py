"""Models and per-particle losses l(theta, z) of dro_flow's experiments (torch).

A `Problem` holds the training data and builds the model; `loss(model, z, y)` maps particles
z of shape (B, M, d) with labels y of shape (B,) to per-particle losses (B, M). Each particle's loss
depends on its own z only, so one backward pass of the sum gives every particle's z-gradient.
`energy(model, y)` is that loss with theta frozen, what the samplers see; for the least-squares
problem it also carries its closed-form z-gradient (no autograd in the inner loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class FrozenLS:
    """l(xi) = ||c + xi u||^2 / m with c = A0 theta - b, u = A1 theta computed once per outer step; the
    same float operations as `LinearLS.residual`, so the values are bit-identical to it."""

    c: torch.Tensor
    u: torch.Tensor

    def __call__(self, xi: torch.Tensor) -> torch.Tensor:
        r = self.c + xi * self.u
        return (r * r).sum(-1) / r.shape[-1]

    def value_and_grad(self, xi: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """l(xi) and scale * dl/dxi = scale * (2 / m) <r, u>, in the order of the operations autograd
        runs on `__call__` (g r + g r, times u, summed), so the gradient is bit-identical to autograd's."""
        r = self.c + xi * self.u
        m = r.shape[-1]
        gr = (scale / m) * r
        return (r * r).sum(-1) / m, ((gr + gr) * self.u).sum(-1, keepdim=True)


class LinearLS(nn.Module):
    """theta of the uncertain least-squares problem, l(theta, xi) = ||(A0 + xi A1) theta - b||^2 / m."""

    def __init__(self, a0: np.ndarray, a1: np.ndarray, b: np.ndarray):
        super().__init__()
        self.register_buffer("a0", torch.as_tensor(a0, dtype=torch.float64))
        self.register_buffer("a1", torch.as_tensor(a1, dtype=torch.float64))
        self.register_buffer("b", torch.as_tensor(b, dtype=torch.float64))
        self.theta = nn.Parameter(torch.zeros(self.a0.shape[1], dtype=torch.float64))

    def residual(self, xi: torch.Tensor) -> torch.Tensor:
        """(..., 1) -> (..., m): A0 theta - b + xi A1 theta."""
        return self.a0 @ self.theta - self.b + xi * (self.a1 @ self.theta)

    def frozen(self) -> FrozenLS:
        """The loss in xi with theta fixed at its current value (no graph to theta)."""
        with torch.no_grad():
            return FrozenLS(self.a0 @ self.theta - self.b, self.a1 @ self.theta)

    def erm_fit(self, xi: np.ndarray) -> None:
        """ERM in closed form: the stacked least-squares problem over the training xi (the official
        script minimises the same objective with BFGS)."""
        a0, a1, b = (t.numpy() for t in (self.a0, self.a1, self.b))
        stacked = np.vstack([a0 + x * a1 for x in np.ravel(xi)])
        theta = np.linalg.lstsq(stacked, np.tile(b, len(np.ravel(xi))), rcond=None)[0]
        with torch.no_grad():
            self.theta.copy_(torch.as_tensor(theta))


def mlp(d_in: int, hidden: list[int], n_classes: int) -> nn.Module:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(d_in, h), nn.ReLU()]
        d_in = h
    layers.append(nn.Linear(d_in, n_classes))
    return nn.Sequential(*layers)


@dataclass
class Problem:
    """Training data (x: (N, d), y: (N,)) and the model family of one dataset."""

    kind: str  # least_squares | classifier
    x: torch.Tensor
    y: torch.Tensor
    model_spec: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    n_classes: int = 0

    def build(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        if self.kind == "least_squares":
            return LinearLS(np.array(self.meta["A0"]), np.array(self.meta["A1"]), np.array(self.meta["b"]))
        return mlp(self.x.shape[1], list(self.model_spec["hidden"]), self.n_classes)

    def energy(self, model: nn.Module, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """z -> per-particle loss with the model's parameters frozen: the samplers' energy. For least
        squares a `FrozenLS` (closed-form z-gradient); otherwise the model's loss, differentiated by autograd."""
        if self.kind == "least_squares":
            return model.frozen()
        return lambda z: self.loss(model, z, y)

    def loss(self, model: nn.Module, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.kind == "least_squares":
            r = model.residual(z)
            return (r * r).sum(-1) / r.shape[-1]
        b, m, d = z.shape
        logits = model(z.reshape(b * m, d))
        return F.cross_entropy(logits, y.repeat_interleave(m), reduction="none").reshape(b, m)


def make_problem(train: Any, meta: dict[str, Any], model_spec: dict[str, Any]) -> Problem:
    """From the preprocessed training frame (x0.., y) and its metadata."""
    cols = [c for c in train.columns if c.startswith("x")]
    kind = "least_squares" if model_spec["kind"] == "linear_ls" else "classifier"
    dtype = torch.float64 if kind == "least_squares" else torch.float32
    x = torch.as_tensor(train[cols].to_numpy(), dtype=dtype)
    y = torch.as_tensor(train["y"].to_numpy(), dtype=torch.long)
    return Problem(kind=kind, x=x, y=y, model_spec=model_spec, meta=meta, n_classes=int(y.max()) + 1)
