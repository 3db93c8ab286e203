"""The autocorrelated intrinsic reward of spec section 2.3 [R] (Wiener-Khinchin).

A power spectral density S(omega) (default Lorentzian) fixes a temporal kernel rho = IFFT(S),
rho(0) = 1 (Wiener-Khinchin: autocorrelation = inverse Fourier transform of the PSD). Per trajectory,
r_int_t = beta_k sum_{l >= 0} rho(l) nov(s_{t+1+l}) (anti-causal: earlier steps are credited for novel
states reached later), with nov(s) = 1 / sqrt(1 + N(s)) from visit counts; beta_k anneals linearly to 0.
"""

from __future__ import annotations

import torch


def lorentzian_psd(n: int, omega_r: float, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """S(omega_k) = 1 / (1 + (omega_k / omega_r)^2) on the length-n DFT grid, omega_k = min(k, n-k)/n."""
    k = torch.arange(n, dtype=dtype)
    omega = torch.minimum(k, n - k) / n
    return 1.0 / (1.0 + (omega / omega_r) ** 2)


def autocorrelation_kernel(psd: torch.Tensor) -> torch.Tensor:
    """rho = Re IFFT(S) normalised to rho(0) = 1 (Wiener-Khinchin)."""
    rho = torch.fft.ifft(psd.to(torch.complex128)).real.to(psd.dtype)
    return rho / rho[0]


def circular_autocorrelation_fft(x: torch.Tensor) -> torch.Tensor:
    """a(l) = sum_t x_t x_{t+l mod n}, computed as IFFT(|FFT(x)|^2) (Wiener-Khinchin)."""
    spec = torch.fft.fft(x, dim=-1)
    return torch.fft.ifft(spec.abs() ** 2, dim=-1).real


def anticausal_credit(nov_next: torch.Tensor, lengths: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """sum_{l >= 0} rho(l) nov_next[t + l] per column of `nov_next` (T, B), zero beyond each length;
    a linear (zero-padded) correlation computed with one FFT of length 2T."""
    t_max = nov_next.shape[0]
    steps = torch.arange(t_max, device=nov_next.device)[:, None]
    x = torch.where(steps < lengths[None, :], nov_next, torch.zeros_like(nov_next))
    kernel = torch.zeros(t_max, dtype=x.dtype, device=x.device)
    m = min(t_max, rho.shape[0])
    kernel[:m] = rho[:m].to(x.dtype)
    size = 2 * t_max
    # correlation: y_t = sum_l k_l x_{t+l} = conv(x, reversed k) shifted
    fx = torch.fft.rfft(x, n=size, dim=0)
    fk = torch.fft.rfft(kernel, n=size)
    y = torch.fft.irfft(fx * fk.conj()[:, None], n=size, dim=0)[:t_max]
    return torch.where(steps < lengths[None, :], y, torch.zeros_like(y))


def novelty(counts: torch.Tensor) -> torch.Tensor:
    """nov(s) = 1 / sqrt(1 + N(s))."""
    return 1.0 / torch.sqrt(1.0 + counts.to(torch.float64))


def annealed_beta(beta0: float, iteration: int, n_iterations: int, anneal_fraction: float = 0.5) -> float:
    """beta_k: linear from beta0 at iteration 0 to 0 at anneal_fraction * n_iterations, then 0."""
    end = anneal_fraction * n_iterations
    if end <= 0:
        return 0.0
    return float(beta0 * max(0.0, 1.0 - iteration / end))
