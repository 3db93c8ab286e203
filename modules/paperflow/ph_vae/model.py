"""PH-VAE and its baseline decoders (spec ph_vae.md sections 2 and 3).

Encoder, latent, prior and loss are shared; only the decoder likelihood head changes. Every head
maps the last decoder hidden layer h [B, hidden] to per-dimension parameters and exposes
``params(h)``, ``log_prob(h, x) -> [B, D]`` and ``sample(h, generator) -> [B, D]``.
"""

from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import Normal, StudentT
from torch.nn.functional import softplus

from paperflow.ph_vae import phase_type

LOGVAR_RANGE = (-10.0, 4.0)  # encoder logvar clamp, as the official code


def xavier_linear(n_in: int, n_out: int) -> nn.Linear:
    """Linear layer with Xavier-uniform weights and zero biases (spec 2, architecture)."""
    layer = nn.Linear(n_in, n_out)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def mlp_block(sizes: list[int]) -> nn.Sequential:
    """Linear + LayerNorm + ReLU for each consecutive pair of ``sizes`` (spec 2, architecture)."""
    layers: list[nn.Module] = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        layers += [xavier_linear(n_in, n_out), nn.LayerNorm(n_out), nn.ReLU()]
    return nn.Sequential(*layers)


class GaussianHead(nn.Module):
    """x_j | z ~ N(mu_j, sigma_j^2) with a learned log sigma (spec 3, Gaussian VAE)."""

    def __init__(self, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.loc = xavier_linear(hidden, out_dim)
        self.log_scale = xavier_linear(hidden, out_dim)

    def params(self, h: Tensor) -> dict[str, Tensor]:
        return {"loc": self.loc(h), "scale": torch.exp(self.log_scale(h))}

    def log_prob(self, h: Tensor, x: Tensor) -> Tensor:
        return Normal(**self.params(h)).log_prob(x)

    def sample(self, h: Tensor, generator: torch.Generator | None = None) -> Tensor:
        p = self.params(h)
        noise = torch.randn(p["loc"].shape, generator=generator, dtype=h.dtype, device=h.device)
        return p["loc"] + p["scale"] * noise


def standard_student_t(df: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Standard Student-t draws by Bailey's polar method (Bailey 1994, Math. Comp. 62), exact and seedable."""
    draws = torch.empty_like(df)
    pending = torch.ones_like(df, dtype=torch.bool)
    while pending.any():
        u, v = 2.0 * torch.rand((2,) + df.shape, generator=generator, dtype=df.dtype, device=df.device) - 1.0
        w = u**2 + v**2
        accept = pending & (w < 1.0) & (w > 0.0)
        w_safe = torch.where(accept, w, torch.full_like(w, 0.5))
        value = u * torch.sqrt(df * (w_safe ** (-2.0 / df) - 1.0) / w_safe)
        draws = torch.where(accept, value, draws)
        pending = pending & ~accept
    return draws


class StudentTHead(nn.Module):
    """x_j | z ~ t_nu(mu_j, s_j), scale and nu by softplus + floor (spec 3; Takahashi et al. 2018)."""

    def __init__(self, hidden: int, out_dim: int, scale_floor: float = 1e-4, df_floor: float = 0.1) -> None:
        super().__init__()
        self.loc = xavier_linear(hidden, out_dim)
        self.scale_raw = xavier_linear(hidden, out_dim)
        self.df_raw = xavier_linear(hidden, out_dim)
        self.scale_floor = scale_floor
        self.df_floor = df_floor

    def params(self, h: Tensor) -> dict[str, Tensor]:
        return {
            "loc": self.loc(h),
            "scale": softplus(self.scale_raw(h)) + self.scale_floor,
            "df": softplus(self.df_raw(h)) + self.df_floor,
        }

    def log_prob(self, h: Tensor, x: Tensor) -> Tensor:
        return StudentT(**self.params(h)).log_prob(x)

    def sample(self, h: Tensor, generator: torch.Generator | None = None) -> Tensor:
        p = self.params(h)
        return p["loc"] + p["scale"] * standard_student_t(p["df"], generator)


def gev_log_prob(
    x: Tensor,
    loc: Tensor,
    scale: Tensor,
    shape: Tensor,
    t_min: float = 1e-6,
    penalty: float = 1.0,
    max_log_power: float = 10.0,
) -> Tensor:
    """GEV log-density for shape xi > 0, with a soft penalty outside the support.

    log f = -log sigma - (1 + 1/xi) log t - t^(-1/xi), t = 1 + xi (x - mu) / sigma (GEV law, Coles 2001, ch. 3).
    Where t < t_min the density is frozen at t = t_min and ``penalty * (t_min - t)`` is subtracted,
    so the value is finite, continuous, and its gradient moves the support to cover x. The term
    t^(-1/xi) = -log F(x) is capped at exp(max_log_power): this changes the density only where
    F(x) < exp(-e^10) at the default, and keeps the loss bounded near the lower end point in float32.
    """
    log_t = torch.log1p((shape * (x - loc) / scale).clamp_min(t_min - 1.0))
    power = torch.exp((-log_t / shape).clamp_max(max_log_power))
    inside = -torch.log(scale) - (1.0 + 1.0 / shape) * log_t - power
    violation = (t_min - 1.0 - shape * (x - loc) / scale).clamp_min(0.0)
    return inside - penalty * violation


class GEVHead(nn.Module):
    """Extreme-value decoder: x_j | z ~ GEV(mu_j, sigma_j, xi_j) with xi_j = softplus + floor > 0.

    The paper's extreme-value decoder is not specified (spec 3, 9); this is the Frechet-type GEV
    (Pareto-like upper tail with index 1/xi), chosen because the spec asks for a heavy-tailed EV
    baseline and the GEV is the limit law of maxima; it is not the construction of the related
    EVT-VAE of Lafon, Naveau and Fablet (arXiv 2306.10987). Its support x > mu - sigma/xi is
    enforced softly by ``gev_log_prob``. scipy's ``genextreme`` uses the shape c = -xi.
    """

    def __init__(
        self, hidden: int, out_dim: int, scale_floor: float = 1e-4, shape_floor: float = 1e-3, penalty: float = 1.0
    ) -> None:
        super().__init__()
        self.loc = xavier_linear(hidden, out_dim)
        self.scale_raw = xavier_linear(hidden, out_dim)
        self.shape_raw = xavier_linear(hidden, out_dim)
        self.scale_floor = scale_floor
        self.shape_floor = shape_floor
        self.penalty = penalty

    def params(self, h: Tensor) -> dict[str, Tensor]:
        return {
            "loc": self.loc(h),
            "scale": softplus(self.scale_raw(h)) + self.scale_floor,
            "shape": softplus(self.shape_raw(h)) + self.shape_floor,
        }

    def log_prob(self, h: Tensor, x: Tensor) -> Tensor:
        return gev_log_prob(x, **self.params(h), penalty=self.penalty)

    def sample(self, h: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Inverse CDF: x = mu + sigma/xi * (E^(-xi) - 1), E ~ Exp(1) = -log U."""
        p = self.params(h)
        unit_exp = torch.empty_like(p["loc"]).exponential_(generator=generator)
        return p["loc"] + p["scale"] / p["shape"] * torch.expm1(-p["shape"] * torch.log(unit_exp))


LIKELIHOODS = {
    "expm": phase_type.log_density_expm,
    "uniformisation": phase_type.log_density_uniformisation,
}


class PHHead(nn.Module):
    """x_j | z ~ PH(alpha_j, A_j) in series form: alpha_j = softmax, rates by cumsum (spec 2)."""

    def __init__(
        self, hidden: int, out_dim: int, n_phases: int = 8, likelihood: str = "expm", rate_floor: float = 0.01
    ) -> None:
        super().__init__()
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"unknown PH likelihood {likelihood!r}; allowed: {sorted(LIKELIHOODS)}")
        self.out_dim = out_dim
        self.n_phases = n_phases
        self.alpha_logits = xavier_linear(hidden, out_dim * n_phases)
        self.rate_raw = xavier_linear(hidden, out_dim * n_phases)
        self.log_density = LIKELIHOODS[likelihood]
        self.rate_floor = rate_floor

    def params(self, h: Tensor) -> dict[str, Tensor]:
        shape = h.shape[:-1] + (self.out_dim, self.n_phases)
        return {
            "alpha": torch.softmax(self.alpha_logits(h).view(shape), dim=-1),
            "rates": phase_type.rates_from_raw(self.rate_raw(h).view(shape), self.rate_floor),
        }

    def log_prob(self, h: Tensor, x: Tensor) -> Tensor:
        p = self.params(h)
        return self.log_density(x, p["alpha"], p["rates"])

    def sample(self, h: Tensor, generator: torch.Generator | None = None) -> Tensor:
        p = self.params(h)
        return phase_type.sample(p["alpha"], p["rates"], generator)


HEADS = {"gauss": GaussianHead, "student_t": StudentTHead, "gev": GEVHead, "ph": PHHead}


def gaussian_kl(mu: Tensor, logvar: Tensor) -> Tensor:
    """KL(N(mu, diag exp(logvar)) || N(0, I)) summed over latent dims (Kingma and Welling 2014, app. B)."""
    return 0.5 * (torch.exp(logvar) + mu**2 - 1.0 - logvar).sum(dim=-1)


class VAE(nn.Module):
    """VAE with a shared encoder and a pluggable decoder likelihood (spec 2 architecture, spec 3).

    ``fixed_latent=True`` pins z = 0 and drops the KL term, which reduces training to a maximum
    likelihood fit of one decoder law (spec 10, check 5). ``n_phases`` and ``likelihood`` apply to
    the "ph" decoder only.
    """

    def __init__(
        self,
        input_dim: int,
        latent_dim: int,
        decoder: str,
        encoder_hidden: tuple[int, ...] = (32, 16),
        decoder_hidden: tuple[int, ...] = (16, 32),
        n_phases: int = 8,
        beta: float = 1.0,
        likelihood: str = "expm",
        fixed_latent: bool = False,
    ) -> None:
        super().__init__()
        if decoder not in HEADS:
            raise ValueError(f"unknown decoder {decoder!r}; allowed: {sorted(HEADS)}")
        self.latent_dim = latent_dim
        self.beta = beta
        self.fixed_latent = fixed_latent
        self.encoder = mlp_block([input_dim, *encoder_hidden])
        self.enc_mu = xavier_linear(encoder_hidden[-1], latent_dim)
        self.enc_logvar = xavier_linear(encoder_hidden[-1], latent_dim)
        self.decoder = mlp_block([latent_dim, *decoder_hidden])
        head_options = {"n_phases": n_phases, "likelihood": likelihood} if decoder == "ph" else {}
        self.head = HEADS[decoder](decoder_hidden[-1], input_dim, **head_options)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """q(z | x) = N(mu, diag exp(logvar)), logvar clamped to LOGVAR_RANGE."""
        features = self.encoder(x)
        return self.enc_mu(features), self.enc_logvar(features).clamp(*LOGVAR_RANGE)

    def elbo_terms(self, x: Tensor) -> dict[str, Tensor]:
        """One-sample ELBO pieces: recon = sum_j log p(x_j | z) [B], kl = KL(q(z|x) || N(0, I)) [B]."""
        if self.fixed_latent:
            z = x.new_zeros(x.shape[0], self.latent_dim)
            kl = x.new_zeros(x.shape[0])
        else:
            mu, logvar = self.encode(x)
            z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
            kl = gaussian_kl(mu, logvar)
        recon = self.head.log_prob(self.decoder(z), x).sum(dim=-1)
        return {"recon": recon, "kl": kl}

    def loss(self, x: Tensor) -> Tensor:
        """Negative ELBO, batch mean: mean(-(recon - beta kl))  (spec 2, ELBO)."""
        terms = self.elbo_terms(x)
        return -(terms["recon"] - self.beta * terms["kl"]).mean()

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """n draws from the model: z ~ N(0, I) (z = 0 when fixed_latent), then x ~ p(x | z)  (spec 2)."""
        weight = self.enc_mu.weight
        options = {"dtype": weight.dtype, "device": weight.device}
        if self.fixed_latent:
            z = torch.zeros(n, self.latent_dim, **options)
        else:
            z = torch.randn(n, self.latent_dim, generator=generator, **options)
        return self.head.sample(self.decoder(z), generator)

    def parts(self) -> tuple[nn.Module, ...]:
        """The independently trained parts (gradient clipping is per part): the whole VAE."""
        return (self,)


class IndependentVAE(nn.Module):
    """The `ph_indep` ablation (spec 3, 6): one 1-D PH-VAE per coordinate, each with its own encoder,
    latent z_j ~ N(0, I) and decoder, so p(x) = prod_j p_j(x_j) and the coordinates are independent.

    Part j sees x_j only; its ELBO terms are summed over j. Trained in one module with per-part gradient
    clipping (``parts``) and Adam (elementwise), each part follows the same updates as a PH-VAE trained
    alone on column j with the same minibatches. With one coordinate it is the `ph` VAE itself.
    """

    def __init__(self, input_dim: int, latent_dim: int, **options: Any) -> None:
        super().__init__()
        self.members = nn.ModuleList(VAE(1, latent_dim, "ph", **options) for _ in range(input_dim))
        self.latent_dim = latent_dim
        self.beta = self.members[0].beta

    def parts(self) -> tuple[nn.Module, ...]:
        return tuple(self.members)

    def elbo_terms(self, x: Tensor) -> dict[str, Tensor]:
        """recon = sum_j log p_j(x_j | z_j), kl = sum_j KL(q_j(z_j | x_j) || N(0, I)), per row [B]."""
        terms = [vae.elbo_terms(x[:, j : j + 1]) for j, vae in enumerate(self.members)]
        return {key: torch.stack([t[key] for t in terms]).sum(dim=0) for key in ("recon", "kl")}

    def loss(self, x: Tensor) -> Tensor:
        terms = self.elbo_terms(x)
        return -(terms["recon"] - self.beta * terms["kl"]).mean()

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """Coordinate j from part j with its own z_j: the columns are independent draws."""
        return torch.cat([vae.sample(n, generator) for vae in self.members], dim=-1)
