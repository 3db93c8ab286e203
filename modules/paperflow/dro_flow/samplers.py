"""Particle samplers for the worst-case (Gibbs) law of entropic Wasserstein DRO (spec section 2).

Per data point x_i the inner maximiser is
    pi*(z | x_i)  propto  exp((l(theta, z) - lam ||z - x_i||^2) / (lam eps)),
i.e. a Gaussian base N(x_i, eps/2 I) tilted by exp(l / (lam eps)). Every sampler takes
`energy(z) -> (B, M)` (the per-particle loss l(theta, .) with theta frozen), the data points
x of shape (B, 1, d) and a `SamplerConfig`, and returns `Particles`: locations z (B, M, d),
weights w (B, M) summing to one per point, and diagnostics. All updates are vectorised over
(batch x particles). Particles start at x_i every call (cold start). The particles live on x's device;
random draws come from the CPU generator `gen` and move there, so every device sees the same draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Energy = Callable[[torch.Tensor], torch.Tensor]


DEATH_THRESHOLD = 1e-4  # WFR: a particle lighter than this is dead and jumps onto its point's heaviest


@dataclass(frozen=True)
class SamplerConfig:
    """A dataset's `dro` config block (every key set in config/dro_flow.yaml, null where it does not apply)."""

    lam: float  # Lagrange multiplier lambda of the transport penalty
    eps: float  # entropy weight epsilon
    particles: int  # M
    steps: int  # K inner steps
    lr: float  # eta, inner step
    weight_lr: float  # eta_w, Fisher-Rao weight step (WFR)
    clamp: tuple[float, float] | None  # data domain (uncertain least squares: [-1, 1]); None: unbounded
    birth_death: bool  # WFR resampling of dead particles
    grad_scale: float  # multiplies every loss gradient (10 = official ULS script)
    svgd_init_std: float | None  # None: sqrt(eps/2), the Gibbs base std
    rgo_smoothness: float | None  # L, the loss's smoothness in z (RGO needs lam > L/2); None without RGO
    rgo_trials: int | None  # RGO proposals per particle before the fall-back; None without RGO
    dual_max_level: int  # m = 2^L, P(L = l) propto 2^-l on {0..L_max}
    dual_noise: str  # official: x + sqrt(eps) N(0, I); gibbs: x + sqrt(eps/2) N(0, I)


@dataclass
class Particles:
    z: torch.Tensor
    w: torch.Tensor
    info: dict[str, float] = field(default_factory=dict)


def loss_and_grad(energy: Energy, z: torch.Tensor, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-particle loss (B, M) and scale * its z-gradient (B, M, d); no parameter gradients. An energy
    with a closed-form `value_and_grad(z, scale)` (the least-squares one) is not differentiated by autograd."""
    closed_form = getattr(energy, "value_and_grad", None)
    if closed_form is not None:
        return closed_form(z, scale)
    z = z.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = energy(z)
        (grad,) = torch.autograd.grad(loss.sum() * scale, z)
    return loss.detach(), grad


def _clamp(z: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    return z if cfg.clamp is None else z.clamp(cfg.clamp[0], cfg.clamp[1])


def _uniform(z: torch.Tensor) -> torch.Tensor:
    return torch.full(z.shape[:2], 1.0 / z.shape[1], dtype=z.dtype, device=z.device)


def _randn(shape: tuple[int, ...] | torch.Size, gen: torch.Generator | None, like: torch.Tensor) -> torch.Tensor:
    """N(0, I) of `like`'s dtype, drawn on the CPU from `gen` and moved to `like`'s device (a no-op on the CPU)."""
    return torch.randn(shape, generator=gen, dtype=like.dtype).to(like.device)


def langevin_step(
    z: torch.Tensor, grad: torch.Tensor, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None
) -> torch.Tensor:
    """Alg. 3: z + eta (grad l - 2 lam (z - x)) + sqrt(2 eta lam eps) N(0, I); ULA on the Gibbs law."""
    noise = _randn(z.shape, gen, z)
    z = z + cfg.lr * (grad - 2.0 * cfg.lam * (z - x)) + math.sqrt(2.0 * cfg.lr * cfg.lam * cfg.eps) * noise
    return _clamp(z, cfg)


def wgf(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """Wasserstein gradient flow = multi-particle Langevin, equal weights."""
    z = x.expand(-1, cfg.particles, -1).clone()
    for _ in range(cfg.steps):
        _, grad = loss_and_grad(energy, z, cfg.grad_scale)
        z = langevin_step(z, grad, x, cfg, gen)
    return Particles(z, _uniform(z))


def wrm(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """WRM (Sinha, Namkoong, Duchi 2018): gradient ascent on l - lam ||z - x||^2, one particle."""
    z = x.clone()
    for _ in range(cfg.steps):
        _, grad = loss_and_grad(energy, z, cfg.grad_scale)
        z = _clamp(z + cfg.lr * (grad - 2.0 * cfg.lam * (z - x)), cfg)
    return Particles(z, _uniform(z))


def penalised(loss: torch.Tensor, z: torch.Tensor, x: torch.Tensor, lam: float) -> torch.Tensor:
    """f_bar = l - lam ||z - x||^2, the WFR weight energy (spec section 9: the ULS/image-code form)."""
    return loss - lam * ((z - x) ** 2).sum(-1)


def fisher_rao_step(
    log_w: torch.Tensor, energy_values: torch.Tensor, lam: float, eps: float, weight_lr: float
) -> torch.Tensor:
    """Alg. 4 weight step (mirror descent): log w <- (1 - lam eps eta_w) log w + eta_w f, normalised.
    Its fixed point is w propto exp(f / (lam eps))."""
    log_w = (1.0 - lam * eps * weight_lr) * log_w + weight_lr * energy_values
    return log_w - torch.logsumexp(log_w, dim=1, keepdim=True)


def birth_death(
    z: torch.Tensor, w: torch.Tensor, threshold: float, grad: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor | None]:
    """Particles with weight < threshold jump onto their point's heaviest particle; the mass of the
    heaviest and the dead ones is shared equally among them. Rows without dead particles are unchanged.
    `grad` (the loss gradient at z) is moved along: a copied particle has its source's gradient."""
    dead = w < threshold
    n_dead = int(dead.sum())
    if not n_dead:  # nothing moves and no weight changes (the caller keeps its log-weights)
        return z, w, 0, grad
    best = w.argmax(dim=1)
    rows = torch.arange(z.shape[0], device=z.device)
    z = torch.where(dead[..., None], z[rows, best][:, None, :], z)
    if grad is not None:
        grad = torch.where(dead[..., None], grad[rows, best][:, None, :], grad)
    group = dead.clone()
    group[rows, best] = True
    total = (w * group).sum(1, keepdim=True)
    w = torch.where(group, total / group.sum(1, keepdim=True), w)
    return z, w, n_dead, grad


def wfr(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """Wasserstein-Fisher-Rao flow: a Langevin location step, then a Fisher-Rao weight step on
    f_bar at the new locations, then birth-death."""
    z = x.expand(-1, cfg.particles, -1).clone()
    log_w = torch.log(_uniform(z))
    _, grad = loss_and_grad(energy, z, cfg.grad_scale)
    deaths = 0
    for _ in range(cfg.steps):
        z = langevin_step(z, grad, x, cfg, gen)
        loss, grad = loss_and_grad(energy, z, cfg.grad_scale)
        log_w = fisher_rao_step(log_w, penalised(loss, z, x, cfg.lam), cfg.lam, cfg.eps, cfg.weight_lr)
        if cfg.birth_death:
            z, w, n, grad = birth_death(z, log_w.exp(), DEATH_THRESHOLD, grad)
            if n:
                deaths += n
                log_w = torch.log(w)
    return Particles(z, log_w.exp(), {"deaths": float(deaths)})


def rbf_kernel(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RBF kernel per data point, k = exp(-d^2 / (2 h^2)), h^2 = median(d^2) / (2 log(M + 1))."""
    d2 = torch.cdist(z, z) ** 2
    med = d2.flatten(1).median(dim=1).values
    h2 = (0.5 * med / math.log(z.shape[1] + 1)).clamp_min(1e-12)[:, None, None]
    return torch.exp(-d2 / (2.0 * h2)), h2


def svgd_direction(z: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """phi(z_j) = (1/M) sum_k [k(z_k, z_j) s(z_k) + grad_{z_k} k(z_k, z_j)] (Alg. 5)."""
    k, h2 = rbf_kernel(z)
    repulsion = (z * k.sum(2, keepdim=True) - k @ z) / h2
    return (k @ score + repulsion) / z.shape[1]


def svgd(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """Stein variational gradient flow on the Gibbs law, with the RMSprop-style step of the official
    code (decay 0.9, eps 1e-6)."""
    std = math.sqrt(cfg.eps / 2.0) if cfg.svgd_init_std is None else cfg.svgd_init_std
    shape = (x.shape[0], cfg.particles, x.shape[2])
    z = _clamp(x + std * _randn(shape, gen, x), cfg)
    hist = None
    for _ in range(cfg.steps):
        _, grad = loss_and_grad(energy, z, cfg.grad_scale)
        score = (grad - 2.0 * cfg.lam * (z - x)) / (cfg.lam * cfg.eps)
        phi = svgd_direction(z, score)
        hist = phi**2 if hist is None else 0.9 * hist + 0.1 * phi**2
        z = _clamp(z + cfg.lr * phi / (hist.sqrt() + 1e-6), cfg)
    return Particles(z, _uniform(z))


def rgo(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """Restricted Gaussian oracle (Alg. 6): z* = argmax l - lam ||z - x||^2 (the WRM point), then
    rejection sampling of g(z) = (-l + lam ||z - x||^2) / (lam eps) with proposals N(z*, s^2 I),
    s^2 = lam eps / (2 lam - L); acceptance exp(-g(z) + g(z*) + ||z - z*||^2 / (2 s^2)) <= 1 when l
    is L-smooth. Particles still rejected after `rgo_trials` stay at z* (counted as fall-backs)."""
    if cfg.rgo_smoothness is None or cfg.rgo_trials is None:
        raise ValueError("RGO needs rgo_smoothness and rgo_trials in the dro config (they are null)")
    if 2.0 * cfg.lam <= cfg.rgo_smoothness:
        raise ValueError(f"RGO needs lam > L/2; lam = {cfg.lam}, L = {cfg.rgo_smoothness}")
    z_star = wrm(energy, x, cfg).z.expand(-1, cfg.particles, -1)
    var = cfg.lam * cfg.eps / (2.0 * cfg.lam - cfg.rgo_smoothness)
    le = cfg.lam * cfg.eps

    def g(z: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return (-energy(z) + cfg.lam * ((z - x) ** 2).sum(-1)) / le

    g_star = g(z_star)
    z = z_star.clone()
    pending = torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
    for _ in range(cfg.rgo_trials):
        step = math.sqrt(var) * _randn(z.shape, gen, z)
        cand = _clamp(z_star + step, cfg)
        log_acc = -g(cand) + g_star + (step**2).sum(-1) / (2.0 * var)
        u = torch.rand(log_acc.shape, generator=gen, dtype=z.dtype).to(z.device)
        accept = pending & (torch.log(u) < log_acc)
        z = torch.where(accept[..., None], cand, z)
        pending &= ~accept
        if not pending.any():
            break
    return Particles(z, _uniform(z), {"fallback_rate": float(pending.float().mean())})


def dual_level(max_level: int, gen: torch.Generator | None) -> int:
    """L with P(L = l) propto 2^-l, l in {0..max_level} (the official Dual baseline's level draw)."""
    probs = torch.tensor([2.0**-l for l in range(max_level + 1)])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen))


def dual_weights(loss: torch.Tensor, lam: float, eps: float) -> torch.Tensor:
    """softmax_j(l_ij / (lam eps)): the dual Sinkhorn-DRO estimator's importance weights."""
    return torch.softmax(loss / (lam * eps), dim=1)


def dual_objective(loss: torch.Tensor, lam: float, eps: float) -> torch.Tensor:
    """lam eps * mean_i [logsumexp_j(l_ij / (lam eps)) - log m] (Wang, Gao, Xie 2021); its theta-gradient
    is the softmax-weighted gradient."""
    le = lam * eps
    return le * (torch.logsumexp(loss / le, dim=1) - math.log(loss.shape[1])).mean()


def dual(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """Dual Sinkhorn-DRO: m = 2^L reference samples per point, softmax(l / (lam eps)) weights."""
    m = 2 ** dual_level(cfg.dual_max_level, gen)
    std = math.sqrt(cfg.eps) if cfg.dual_noise == "official" else math.sqrt(cfg.eps / 2.0)
    z = x + std * _randn((x.shape[0], m, x.shape[2]), gen, x)
    with torch.no_grad():
        loss = energy(z)
    return Particles(
        z,
        dual_weights(loss, cfg.lam, cfg.eps),
        {"objective": float(dual_objective(loss, cfg.lam, cfg.eps)), "m": float(m)},
    )


def fisher_rao_reweighting(
    energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None, steps: int | None = None
) -> Particles:
    """Pure Fisher-Rao flow (no transport) on particles from the Gaussian reference N(x, eps/2 I),
    the entropy taken relative to that reference, so the energy is l alone; its weights converge to
    softmax(l / (lam eps)), the dual estimator's weights (spec section 2, reductions)."""
    z = x + math.sqrt(cfg.eps / 2.0) * _randn((x.shape[0], cfg.particles, x.shape[2]), gen, x)
    with torch.no_grad():
        loss = energy(z)
    log_w = torch.log(_uniform(z))
    for _ in range(cfg.steps if steps is None else steps):
        log_w = fisher_rao_step(log_w, loss, cfg.lam, cfg.eps, cfg.weight_lr)
    return Particles(z, log_w.exp())


def noise(energy: Energy, x: torch.Tensor, cfg: SamplerConfig, gen: torch.Generator | None = None) -> Particles:
    """The claims' control arm, the worst-case tilt switched off: M particles from the Gibbs base law
    N(x_i, eps/2 I) (WGF's stationary law without the loss gradient), clamped to the domain, equal weights;
    Gaussian data augmentation at the samplers' own noise level. The energy is never evaluated."""
    shape = (x.shape[0], cfg.particles, x.shape[2])
    z = _clamp(x + math.sqrt(cfg.eps / 2.0) * _randn(shape, gen, x), cfg)
    return Particles(z, _uniform(z))


SAMPLERS = {"wgf": wgf, "wfr": wfr, "svg": svgd, "rgo": rgo, "wrm": wrm, "dual": dual, "noise": noise}
