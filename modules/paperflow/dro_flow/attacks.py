"""Test-time attacks on classifiers: FGSM and PGD in l_inf or l_2 balls (spec section 8)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _input_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(F.cross_entropy(model(x), y, reduction="sum"), x)
    return grad


def _unit(g: torch.Tensor, norm: str) -> torch.Tensor:
    if norm == "linf":
        return g.sign()
    return g / g.norm(dim=1, keepdim=True).clamp_min(1e-12)


def project(delta: torch.Tensor, radius: float, norm: str) -> torch.Tensor:
    if norm == "linf":
        return delta.clamp(-radius, radius)
    n = delta.norm(dim=1, keepdim=True)
    return delta * torch.clamp(radius / n.clamp_min(1e-12), max=1.0)


def fgsm(model: nn.Module, x: torch.Tensor, y: torch.Tensor, radius: float, norm: str) -> torch.Tensor:
    """x + r * sign(grad) (l_inf) or x + r * grad / ||grad|| (l_2)."""
    return x + radius * _unit(_input_grad(model, x, y), norm)


def pgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    radius: float,
    norm: str,
    steps: int,
    alpha: float,
    gen: torch.Generator | None = None,
) -> torch.Tensor:
    """Projected gradient ascent on the cross-entropy from a uniform random start in the ball."""
    if norm == "linf":
        delta = (2 * torch.rand(x.shape, generator=gen, dtype=x.dtype) - 1) * radius
    else:
        direction = torch.randn(x.shape, generator=gen, dtype=x.dtype)
        u = torch.rand((x.shape[0], 1), generator=gen, dtype=x.dtype) ** (1.0 / x.shape[1])
        delta = radius * u * _unit(direction, "l2")
    for _ in range(steps):
        delta = project(delta + alpha * _unit(_input_grad(model, x + delta, y), norm), radius, norm)
    return x + delta


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())
