"""The spectral (Fourier-domain) loss of spec section 2.2 [R]: per-trajectory DFT of the per-step
detailed-balance residuals, weighted by a low-pass frequency response.

    L_ST(tau) = (1/n) sum_k w(omega_k) |Delta_k|^2,   omega_k = min(k, n-k)/n      (spec eq. 2.2)

w = 1 gives sum_t delta_t^2 (Parseval: the DB loss of tau); w = (1, 0, ..., 0) gives
(sum_t delta_t)^2 / n (TB / n); the Tikhonov filter w_lam = 1 / (1 + 4 lam sin^2(pi omega)) makes
L_ST = delta^T (I + lam D^T D)^(-1) delta, D the circular first difference (regularised value iteration).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

Filter = Callable[[torch.Tensor], torch.Tensor]


def frequencies(n: int, dtype: torch.dtype = torch.float64, device=None) -> torch.Tensor:
    """omega_k = min(k, n - k) / n for k = 0..n-1 (in cycles per step, within [0, 0.5])."""
    k = torch.arange(n, dtype=dtype, device=device)
    return torch.minimum(k, n - k) / n


def tikhonov(lam: float) -> Filter:
    """w_lam(omega) = 1 / (1 + 4 lam sin^2(pi omega)); lam = 0 is the all-pass (DB) filter."""
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    return lambda omega: 1.0 / (1.0 + 4.0 * lam * torch.sin(math.pi * omega) ** 2)


def butterworth(omega_c: float, order: int = 2) -> Filter:
    """w(omega) = 1 / (1 + (omega / omega_c)^(2 order)), the alternative filter of spec 2.2."""
    if not 0 < omega_c <= 0.5:
        raise ValueError(f"omega_c must be in (0, 0.5], got {omega_c}")
    return lambda omega: 1.0 / (1.0 + (omega / omega_c) ** (2 * order))


def dc_only() -> Filter:
    """w = (1, 0, ..., 0): only the mean residual survives (the TB limit)."""
    return lambda omega: (omega == 0).to(omega.dtype)


def make_filter(kind: str, lam: float = 0.0, omega_c: float = 0.25, order: int = 2) -> Filter:
    if kind == "tikhonov":
        return tikhonov(lam)
    if kind == "butterworth":
        return butterworth(omega_c, order)
    if kind == "dc":
        return dc_only()
    raise ValueError(f"unknown filter {kind!r}; choose tikhonov, butterworth or dc")


def spectral_energy(delta: torch.Tensor, weight: Filter) -> torch.Tensor:
    """L_ST of each row of `delta` (batch, n), all of length n: (1/n) sum_k w(omega_k) |FFT(delta)_k|^2."""
    n = delta.shape[-1]
    spectrum = torch.fft.fft(delta, dim=-1)
    return (frequency_weights(weight, n, delta.dtype, delta.device) * spectrum.abs() ** 2).sum(-1) / n


@functools.lru_cache(maxsize=1024)
def frequency_weights(weight: Filter, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """w(omega_k), k = 0..n-1, computed once per filter, length, dtype and device (training calls the
    loss with the same few lengths every iteration)."""
    return weight(frequencies(n, dtype=dtype, device=device))


def spectral_loss_per_trajectory(
    delta: torch.Tensor, lengths: torch.Tensor, weight: Filter, pad_to_max: bool = False
) -> torch.Tensor:
    """L_ST per trajectory for padded residuals `delta` (T, B) whose column b has `lengths[b]` valid steps.

    Default: the circular DFT of each trajectory's own length (trajectories grouped by length, one
    batched FFT per group), for which Parseval and the TB limit hold exactly. `pad_to_max`: zero-pad
    every trajectory to T and use one FFT of length T (faster; the identities then hold for length T).
    """
    cols = delta.T  # (B, T)
    steps = torch.arange(cols.shape[1], device=cols.device)
    cols = torch.where(steps[None, :] < lengths[:, None], cols, torch.zeros_like(cols))
    if pad_to_max:
        return spectral_energy(cols, weight)
    out = torch.zeros(cols.shape[0], dtype=cols.dtype, device=cols.device)
    for n in torch.unique(lengths).tolist():
        rows = (lengths == n).nonzero(as_tuple=True)[0]
        out = out.index_put((rows,), spectral_energy(cols[rows, :n], weight))
    return out


def reduce_trajectories(per_traj: torch.Tensor, lengths: torch.Tensor, length_weighting: bool) -> torch.Tensor:
    """Batch loss: mean over trajectories, optionally each weighted by its length n (spec 2.2 flag)."""
    if length_weighting:
        return (per_traj * lengths.to(per_traj.dtype)).mean()
    return per_traj.mean()


def circular_difference(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """D with (D x)_t = x_{t+1 mod n} - x_t; eigenvalues of D^T D are 4 sin^2(pi omega_k)."""
    eye = torch.eye(n, dtype=dtype)
    return torch.roll(eye, shifts=-1, dims=1) - eye


def tikhonov_operator(n: int, lam: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(I + lam D^T D)^(-1) by a dense solve: the matrix form of the Tikhonov spectral loss."""
    d = circular_difference(n, dtype)
    return torch.linalg.solve(torch.eye(n, dtype=dtype) + lam * d.T @ d, torch.eye(n, dtype=dtype))


def circulant_operator(n: int, weight: Filter, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """C = F^H diag(w) F / n with F the unnormalised DFT matrix (real and symmetric for even w)."""
    k = torch.arange(n, dtype=dtype)
    f = torch.exp(-2j * math.pi * torch.outer(k, k) / n)
    w = weight(frequencies(n, dtype=dtype)).to(f.dtype)
    return (f.conj().T @ torch.diag(w) @ f / n).real
