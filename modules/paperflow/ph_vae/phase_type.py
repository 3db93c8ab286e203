"""Phase-type law PH(alpha, A) in series canonical form (spec ph_vae.md section 2).

Phase i moves to phase i + 1 at rate l_i and only the last phase exits, with ordered rates
l_1 <= ... <= l_m. Every function is batched over leading dimensions: ``alpha`` and ``rates`` have
shape [..., m], ``x`` broadcasts against their leading shape, and any float dtype works.
"""

import math

import torch
from torch import Tensor
from torch.nn.functional import softplus

X_MIN = 1e-8  # x clamp before exp(A x), as the official code
DENSITY_MIN = 1e-12  # density clamp before the log, as the official code


def rates_from_raw(raw: Tensor, floor: float = 0.01) -> Tensor:
    """Ordered rates l_i = sum_{j <= i} (softplus(raw_j) + floor)  (spec 2, series form)."""
    return torch.cumsum(softplus(raw) + floor, dim=-1)


def series_generator(rates: Tensor) -> Tensor:
    """Sub-generator A: diagonal -l_i, super-diagonal +l_i for the move i -> i + 1  (spec 2)."""
    return torch.diag_embed(-rates) + torch.diag_embed(rates[..., :-1], offset=1)


def exit_vector(rates: Tensor) -> Tensor:
    """Exit vector a = -A 1 = (0, ..., 0, l_m): only the last phase is absorbed  (spec 2)."""
    return torch.cat([torch.zeros_like(rates[..., :-1]), rates[..., -1:]], dim=-1)


def _transient_matrix(x: Tensor, rates: Tensor) -> Tensor:
    """exp(A x) for x broadcast over the leading shape of ``rates``, x clamped >= X_MIN."""
    x = x.clamp_min(X_MIN)[..., None, None]
    return torch.linalg.matrix_exp(series_generator(rates) * x)


def _row_times_matrix_times_col(row: Tensor, matrix: Tensor, col: Tensor) -> Tensor:
    """row M col over leading dims: [..., m] x [..., m, m] x [..., m] -> [...]."""
    return (row.unsqueeze(-2) @ matrix @ col.unsqueeze(-1))[..., 0, 0]


def log_density_expm(x: Tensor, alpha: Tensor, rates: Tensor) -> Tensor:
    """log f(x) = log(alpha exp(A x) a) by matrix exponential  (spec 2, likelihood)."""
    density = _row_times_matrix_times_col(alpha, _transient_matrix(x, rates), exit_vector(rates))
    return torch.log(density.clamp_min(DENSITY_MIN))


def poisson_terms_needed(mu_max: float, tol: float) -> int:
    """Smallest K with P(Poisson(mu_max) > K - 1) < tol: terms k = 0..K-1 hold mass > 1 - tol."""
    width = math.ceil(mu_max + 12.0 * math.sqrt(mu_max) + 40.0)
    k = torch.arange(width, dtype=torch.float64)
    # P(N > k) = regularised lower incomplete gamma P(k + 1, mu), exact in the far tail.
    tail = torch.special.gammainc(k + 1.0, torch.tensor(mu_max, dtype=torch.float64))
    return int(torch.nonzero(tail < tol)[0, 0]) + 1


def log_density_uniformisation(
    x: Tensor, alpha: Tensor, rates: Tensor, tol: float = 1e-8, max_terms: int = 500
) -> Tensor:
    """log f(x) with exp(A x) = sum_k Pois(k; L x) P^k, L = max_i l_i, P = I + A / L  (spec 2).

    All points share one number of terms K, the one needed by the largest L x. Raises
    ValueError when K exceeds ``max_terms`` instead of silently truncating.
    """
    x = x.clamp_min(X_MIN)
    top_rate = rates.amax(dim=-1)
    mu = torch.broadcast_tensors(top_rate * x, alpha[..., 0])[0]
    n_terms = poisson_terms_needed(float(mu.detach().max()), tol)
    if n_terms > max_terms:
        raise ValueError(
            f"uniformisation needs {n_terms} terms for max(L x) = {float(mu.max()):.4g} "
            f"at tol = {tol:g}, above max_terms = {max_terms}"
        )
    jump = torch.eye(rates.shape[-1], dtype=rates.dtype, device=rates.device)
    jump = jump + series_generator(rates) / top_rate[..., None, None]
    exit_rates = exit_vector(rates)
    log_mu = torch.log(mu)
    row = torch.broadcast_tensors(alpha, mu[..., None])[0]
    density = torch.zeros_like(mu)
    for k in range(n_terms):
        log_weight = k * log_mu - mu - math.lgamma(k + 1.0)
        density = density + torch.exp(log_weight) * (row * exit_rates).sum(dim=-1)
        row = (row.unsqueeze(-2) @ jump)[..., 0, :]
    return torch.log(density.clamp_min(DENSITY_MIN))


def survival(x: Tensor, alpha: Tensor, rates: Tensor) -> Tensor:
    """S(x) = alpha exp(A x) 1  (spec 2)."""
    return _row_times_matrix_times_col(alpha, _transient_matrix(x, rates), torch.ones_like(rates))


def cdf(x: Tensor, alpha: Tensor, rates: Tensor) -> Tensor:
    """F(x) = 1 - alpha exp(A x) 1  (spec 2)."""
    return 1.0 - survival(x, alpha, rates)


def _green_times_ones(rates: Tensor) -> Tensor:
    """(-A)^{-1} 1: expected time to absorption from each phase."""
    return torch.linalg.solve(-series_generator(rates), torch.ones_like(rates))


def mean(alpha: Tensor, rates: Tensor) -> Tensor:
    """E[X] = alpha (-A)^{-1} 1  (spec 2)."""
    return (alpha * _green_times_ones(rates)).sum(dim=-1)


def variance(alpha: Tensor, rates: Tensor) -> Tensor:
    """Var[X] = 2 alpha A^{-2} 1 - (alpha (-A)^{-1} 1)^2  (standard PH moments)."""
    once = _green_times_ones(rates)
    twice = torch.linalg.solve(-series_generator(rates), once)
    return 2.0 * (alpha * twice).sum(dim=-1) - mean(alpha, rates) ** 2


def sample(alpha: Tensor, rates: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Exact series-form draw: entry phase i ~ alpha, X = sum_{j >= i} E_j, E_j ~ Exp(l_j)  (spec 2).

    One draw per leading index; expand ``alpha`` and ``rates`` to the wanted batch shape first.
    """
    batch_shape, n_phases = alpha.shape[:-1], alpha.shape[-1]
    uniform = torch.rand(batch_shape + (1,), generator=generator, dtype=alpha.dtype, device=alpha.device)
    entry = (torch.cumsum(alpha, dim=-1) < uniform).sum(dim=-1, keepdim=True).clamp_max(n_phases - 1)
    unit_exp = torch.empty_like(rates).exponential_(generator=generator)
    visited = torch.arange(n_phases, device=alpha.device) >= entry
    return (unit_exp / rates * visited).sum(dim=-1)
