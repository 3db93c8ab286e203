"""The ECMO problems in torch, batched over a leading dimension (one row per preference vector).

Every problem is z = (x, y) with a convex lower level g(x, .), constraint h(z) = grad_y g(x, y) = 0
and penalty P(z) = 0.5 ||h(z)||^2. Each gives closed-form, vectorised objectives, gradients, h, the
penalty gradient J_h^T h and J_h (for the stationarity measure); `penalty_grad_autograd` computes the
same gradient by double backward through grad_y g, for any problem (spec §9, a Hessian-vector product).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

Tensor = torch.Tensor


class Problem:
    """Interface: sizes, objectives, gradients, constraint and smoothness constants."""

    n_obj: int
    dim_x: int
    dim_y: int

    def split(self, z: Tensor) -> tuple[Tensor, Tensor]:
        return z[:, : self.dim_x], z[:, self.dim_x :]

    def lower_level(self, x: Tensor, y: Tensor) -> Tensor:  # (B,) value of g
        raise NotImplementedError

    def objectives(self, z: Tensor) -> Tensor:  # (B, S)
        raise NotImplementedError

    def objective_grads(self, z: Tensor) -> Tensor:  # (B, S, d)
        raise NotImplementedError

    def constraint(self, z: Tensor) -> Tensor:  # (B, m)
        raise NotImplementedError

    def penalty_grad(self, z: Tensor) -> Tensor:  # (B, d) = J_h^T h
        raise NotImplementedError

    def jacobian(self, z: Tensor) -> Tensor:  # (B, m, d)
        raise NotImplementedError

    def smoothness(self) -> tuple[float, float]:
        """(L_f, L_h): a bound on the UL gradients' Lipschitz constant and on ||J_h||^2."""
        raise NotImplementedError


def constraint_autograd(problem: Problem, z: Tensor) -> Tensor:
    """h(z) = grad_y g(x, y) by autograd, differentiable in z."""
    z = z if z.requires_grad else z.detach().requires_grad_(True)
    x, y = problem.split(z)
    return torch.autograd.grad(problem.lower_level(x, y).sum(), y, create_graph=True)[0].reshape(len(z), -1)


def penalty_grad_autograd(problem: Problem, z: Tensor) -> Tensor:
    """grad_z 0.5 ||h(z)||^2 by double backward (J_h^T h without forming J_h)."""
    z = z.detach().requires_grad_(True)
    h = constraint_autograd(problem, z)
    return torch.autograd.grad(0.5 * (h**2).sum(), z)[0]


def as_tensor(a: np.ndarray, device: torch.device | str = "cpu") -> Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float64, device=device)


@dataclass
class QuadraticECMO(Problem):
    """Spec §4 synthetic instance: g = 0.5 ||A y - B x - b||^2, f_s = 0.5 ||y - c_s||^2 + 0.25 ||x - e_s||^2."""

    a: Tensor
    b_mat: Tensor
    b: Tensor
    c: Tensor
    e: Tensor

    @classmethod
    def from_arrays(cls, inst: dict[str, np.ndarray], device="cpu") -> QuadraticECMO:
        return cls(*(as_tensor(inst[k], device) for k in ("A", "B", "b", "c", "e")))

    def __post_init__(self):
        self.n_obj, self.dim_x, self.dim_y = self.c.shape[0], self.b_mat.shape[1], self.a.shape[1]
        self._jac = torch.cat([-self.a.T @ self.b_mat, self.a.T @ self.a], dim=1)

    def residual(self, x: Tensor, y: Tensor) -> Tensor:
        return y @ self.a.T - x @ self.b_mat.T - self.b

    def lower_level(self, x, y):
        return 0.5 * (self.residual(x, y) ** 2).sum(-1)

    def objectives(self, z):
        x, y = self.split(z)
        return 0.5 * ((y[:, None] - self.c) ** 2).sum(-1) + 0.25 * ((x[:, None] - self.e) ** 2).sum(-1)

    def objective_grads(self, z):
        x, y = self.split(z)
        return torch.cat([0.5 * (x[:, None] - self.e), y[:, None] - self.c], dim=-1)

    def constraint(self, z):
        return self.residual(*self.split(z)) @ self.a

    def penalty_grad(self, z):
        return self.constraint(z) @ self._jac

    def jacobian(self, z):
        return self._jac.expand(len(z), *self._jac.shape)

    def smoothness(self):
        return 1.0, float(torch.linalg.matrix_norm(self._jac, ord=2) ** 2)


@dataclass
class ConcaveECMO(Problem):
    """Non-convex front: g = 0.5 ||C y - x||^2, f_s = FF_s(x) + 0.5 ||(I - C^+ C) y||^2 (Fonseca-Fleming).

    C is one instance (n, m) shared by every row, or one instance per row (B, n, m): instances of several seeds
    stacked, so that one tensor program runs them all (`stack`)."""

    c: Tensor

    @classmethod
    def from_arrays(cls, inst: dict[str, np.ndarray], device="cpu") -> ConcaveECMO:
        return cls(as_tensor(inst["C"], device))

    @classmethod
    def stack(cls, insts: list[dict[str, np.ndarray]], rows_each: int, device="cpu") -> ConcaveECMO:
        """The instances of `insts` in one problem, each repeated for `rows_each` consecutive rows."""
        return cls(as_tensor(np.repeat(np.stack([inst["C"] for inst in insts]), rows_each, axis=0), device))

    def __post_init__(self):
        self.n_obj, (self.dim_x, self.dim_y) = 2, self.c.shape[-2:]
        self._shift = 1.0 / math.sqrt(self.dim_x)
        eye = torch.eye(self.dim_y, dtype=self.c.dtype, device=self.c.device)
        self._null = eye - torch.linalg.pinv(self.c) @ self.c
        self._jac = torch.cat([-self.c.mT, self.c.mT @ self.c], dim=-1)

    def _times(self, v: Tensor, mat: Tensor) -> Tensor:
        """Each row of v times its instance's matrix: v @ mat, or row by row for stacked instances."""
        return v @ mat if mat.dim() == 2 else torch.einsum("bi,bij->bj", v, mat)

    def lower_level(self, x, y):
        return 0.5 * ((self._times(y, self.c.mT) - x) ** 2).sum(-1)

    def _parts(self, z):
        x, y = self.split(z)
        centred = torch.stack([x - self._shift, x + self._shift], dim=1)  # (B, 2, n)
        decay = torch.exp(-(centred**2).sum(-1))  # (B, 2)
        ny = self._times(y, self._null)
        return centred, decay, ny

    def objectives(self, z):
        _, decay, ny = self._parts(z)
        return 1.0 - decay + 0.5 * (ny**2).sum(-1, keepdim=True)

    def objective_grads(self, z):
        centred, decay, ny = self._parts(z)
        gx = 2.0 * decay[..., None] * centred
        return torch.cat([gx, ny[:, None].expand(-1, 2, -1)], dim=-1)

    def constraint(self, z):
        x, y = self.split(z)
        return self._times(self._times(y, self.c.mT) - x, self.c)

    def penalty_grad(self, z):
        return self._times(self.constraint(z), self._jac)

    def jacobian(self, z):
        return self._jac.expand(len(z), *self._jac.shape[-2:])

    def smoothness(self):
        """(L_f, L_h); L_h per row, shape (B, 1), for stacked instances."""
        l_h = torch.linalg.matrix_norm(self._jac, ord=2) ** 2
        return 2.0, float(l_h) if self._jac.dim() == 2 else l_h[:, None]


@dataclass
class HyperCleaning(Problem):
    """Multi-task data hyper-cleaning (spec §4): x = one logit per training sample, y = linear model W.

    g(x, W) = (1/2n) sum_i sigmoid(x_i) ||W^T phi_i - y_i||^2 (no ridge: the LL Hessian is singular);
    f_s(W) = (1/2 n_s) sum over validation samples of task s of ||W^T phi - y||^2 (x enters only
    through the constraint, as in standard hyper-cleaning)."""

    phi: Tensor  # (n, p) training features
    y_train: Tensor  # (n, k) one-hot noisy labels
    phi_val: Tensor  # (n_v, p)
    y_val: Tensor  # (n_v, k) one-hot clean labels
    task_mask: Tensor  # (S, n_v) 0/1 membership of validation samples in each task

    def __post_init__(self):
        (self.n, self.p), self.k = self.phi.shape, self.y_train.shape[1]
        self.n_obj, self.dim_x, self.dim_y = self.task_mask.shape[0], self.n, self.p * self.k
        self._task_n = self.task_mask.sum(1)
        weighted = self.task_mask[:, :, None] * self.phi_val / self._task_n[:, None, None]  # (S, n_v, p)
        self._val_hess = weighted.transpose(1, 2) @ self.phi_val  # (S, p, p): f_s = 0.5 tr W^T H W - tr W^T C + c
        self._val_cross = weighted.transpose(1, 2) @ self.y_val  # (S, p, k)

    def model_of(self, z: Tensor) -> Tensor:
        return z[:, self.dim_x :].reshape(len(z), self.p, self.k)

    def _phi_t(self, batch: Tensor) -> Tensor:
        """phi^T @ batch for batch (B, n, k), as one (p, n) x (n, B k) product."""
        b = len(batch)
        return (self.phi.T @ batch.permute(1, 0, 2).reshape(self.n, -1)).reshape(self.p, b, self.k).permute(1, 0, 2)

    def _phi(self, w: Tensor) -> Tensor:
        """phi @ w for w (B, p, k)."""
        b = len(w)
        return (self.phi @ w.permute(1, 0, 2).reshape(self.p, -1)).reshape(self.n, b, self.k).permute(1, 0, 2)

    def lower_level(self, x, y):
        w = y.reshape(len(y), self.p, self.k)
        resid = self.phi @ w - self.y_train
        return 0.5 * (torch.sigmoid(x) * (resid**2).sum(-1)).sum(-1) / self.n

    def objectives(self, z):
        sq = ((self.phi_val @ self.model_of(z) - self.y_val) ** 2).sum(-1)  # (B, n_v)
        return 0.5 * sq @ self.task_mask.T / self._task_n

    def objective_grads(self, z):
        gw = (self._val_hess[None] @ self.model_of(z)[:, None] - self._val_cross[None]).reshape(len(z), self.n_obj, -1)
        return torch.cat([torch.zeros(len(z), self.n_obj, self.dim_x, dtype=z.dtype, device=z.device), gw], -1)

    def _h(self, z):
        sig = torch.sigmoid(z[:, : self.dim_x])
        resid = self._phi(self.model_of(z)) - self.y_train  # (B, n, k)
        return sig, resid, self._phi_t(sig[..., None] * resid) / self.n  # (B, p, k)

    def constraint(self, z):
        return self._h(z)[2].reshape(len(z), -1)

    def penalty_grad(self, z):
        sig, resid, h = self._h(z)
        phi_h = self._phi(h)  # (B, n, k)
        gx = sig * (1 - sig) * (phi_h * resid).sum(-1) / self.n
        gw = self._phi_t(sig[..., None] * phi_h) / self.n
        return torch.cat([gx, gw.reshape(len(z), -1)], -1)

    def jacobian(self, z):
        sig, resid, _ = self._h(z)
        jx = torch.einsum("ia,bic,bi->baci", self.phi, resid, sig * (1 - sig)) / self.n
        hess = torch.einsum("ia,bi,ic->bac", self.phi, sig, self.phi) / self.n  # (B, p, p)
        eye = torch.eye(self.k, dtype=z.dtype, device=z.device)
        jw = torch.einsum("bac,kl->bakcl", hess, eye).reshape(len(z), self.dim_y, self.dim_y)
        return torch.cat([jx.reshape(len(z), self.dim_y, self.dim_x), jw], -1)

    def smoothness(self):
        gram = self.phi.T @ self.phi / self.n
        l_h = float(torch.linalg.eigvalsh(gram)[-1] ** 2)
        l_f = max(
            float(torch.linalg.eigvalsh(self.phi_val.T @ (m[:, None] * self.phi_val))[-1] / c)
            for m, c in zip(self.task_mask, self._task_n)
        )
        return l_f, l_h
