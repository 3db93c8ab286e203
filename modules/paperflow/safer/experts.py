"""Per-task experts (spec §2.2 steps 1-5; TPP's prompt + head, SAFER's reshaping and energy).

Every part marked [recon] in the spec is a config switch here: the reshaping (`subspace` whitened
coordinates or `none`), the residual weight beta, the regulariser weights, the energy temperature.
With `reshape: none`, `beta: 0` and every regulariser weight 0 an expert is exactly a TPP expert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paperflow.core.config import reject_unknown
from paperflow.safer.backbone import SGC
from paperflow.safer.fitting import LOOP, Engine, fit_steps

RESHAPES = ("subspace", "none")
# an expert's settings: the `expert` config block and SAFER's own keys (paperflow.safer.training.expert_config)
EXPERT_KEYS = (
    "prompt_basis",
    "epochs",
    "lr",
    "weight_decay",
    "reshape",
    "energy_share",
    "max_rank",
    "beta",
    "temperature",
    "regularizer",
    "energy_propagation",
)


@dataclass(frozen=True)
class Fingerprint:
    """Drift-free statistics of one task (spec §2.2 step 1): mean, top-r right singular vectors of the
    centred frozen-backbone embeddings of its training nodes, and their variances (σ²/n)."""

    mean: torch.Tensor  # (d,)
    basis: torch.Tensor  # (d, r), orthonormal columns
    var: torch.Tensor  # (r,)

    @property
    def rank(self) -> int:
        return int(self.basis.shape[1])


def fingerprint(z: torch.Tensor, energy: float, max_rank: int) -> Fingerprint:
    """r = the smallest rank whose singular values squared reach `energy` of the total, capped at `max_rank`."""
    z = z.detach().double()
    mean = z.mean(0)
    _, s, vh = torch.linalg.svd(z - mean, full_matrices=False)
    share = torch.cumsum(s**2, 0) / (s**2).sum()
    r = min(int(torch.searchsorted(share, torch.tensor(energy, dtype=share.dtype)).item()) + 1, max_rank, len(s))
    return Fingerprint(mean=mean.float(), basis=vh[:r].T.float().contiguous(), var=(s[:r] ** 2 / len(z)).float())


def residual(z: torch.Tensor, fp: Fingerprint) -> torch.Tensor:
    """ρ(z) = ‖(I − UUᵀ)(z − μ)‖², the squared distance of z from the task's affine subspace."""
    centred = z - fp.mean
    return (centred.pow(2).sum(1) - (centred @ fp.basis).pow(2).sum(1)).clamp_min(0.0)


def reshape(z: torch.Tensor, fp: Fingerprint, mode: str) -> torch.Tensor:
    """`subspace`: whitened coordinates λ^{-1/2} Uᵀ(z − μ) (spec §2.2 step 3); `none`: z unchanged."""
    if mode == "subspace":
        return ((z - fp.mean) @ fp.basis) / fp.var.clamp_min(1e-12).sqrt()
    if mode == "none":
        return z
    raise ValueError(f"reshape = {mode!r} is not known; known: {', '.join(RESHAPES)}")


def free_energy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """E = −T log Σ_c exp(l_c / T) (Liu et al. 2020); lower = more in-distribution."""
    return -temperature * torch.logsumexp(logits / temperature, dim=-1)


class GPFPlus(nn.Module):
    """GPF-plus prompt: x + Σ_b softmax_b(a_bᵀx) p_b with `n_basis` learnable basis vectors p_b."""

    def __init__(self, d: int, n_basis: int) -> None:
        super().__init__()
        self.basis = nn.Parameter(torch.empty(n_basis, d))
        nn.init.xavier_uniform_(self.basis)
        self.attention = nn.Linear(d, n_basis)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.softmax(self.attention(x), dim=-1) @ self.basis


class Expert(nn.Module):
    """Prompt p_t and head φ_t of one task, with its fingerprint and energy settings (frozen buffers)."""

    def __init__(self, d_in: int, fp: Fingerprint, n_classes: int, cfg: Mapping[str, Any], rho_scale: float) -> None:
        super().__init__()
        self.mode, self.beta, self.temperature = cfg["reshape"], float(cfg["beta"]), float(cfg["temperature"])
        self.prompt = GPFPlus(d_in, cfg["prompt_basis"])
        self.register_buffer("fp_mean", fp.mean)
        self.register_buffer("fp_basis", fp.basis)
        self.register_buffer("fp_var", fp.var)
        self.register_buffer("rho_scale", torch.tensor(float(rho_scale)))
        self.head = nn.Linear(fp.rank if self.mode == "subspace" else fp.mean.numel(), n_classes)

    @property
    def fingerprint(self) -> Fingerprint:
        return Fingerprint(self.fp_mean, self.fp_basis, self.fp_var)

    def embed(self, backbone: SGC, a_hat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """z_t = f(X + p_t(X)) with the frozen backbone f."""
        return backbone(a_hat, self.prompt(x))

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(reshape(z, self.fingerprint, self.mode))

    def scaled_residual(self, z: torch.Tensor) -> torch.Tensor:
        return residual(z, self.fingerprint) / self.rho_scale

    def energy(self, z: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """E_t = −T log Σ exp(φ_t(z̃)/T) + β ρ_t(z) / mean training ρ_t (spec §2.2 step 4)."""
        e = free_energy(self.logits(z) if logits is None else logits, self.temperature)
        return e + self.beta * self.scaled_residual(z) if self.beta else e


def compactness(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """mean_i ‖ẑ_i − c_{y_i}‖² with ẑ L2-normalised and c the class centroids of the batch."""
    z = F.normalize(z, dim=1)
    classes, inverse = torch.unique(y, return_inverse=True)
    centroids = torch.zeros(len(classes), z.shape[1], dtype=z.dtype, device=z.device).index_add_(0, inverse, z)
    centroids = centroids / torch.bincount(inverse, minlength=len(classes)).unsqueeze(1).to(z.dtype)
    return (z - centroids[inverse]).pow(2).sum(1).mean()


def train_expert(
    backbone: SGC,
    a_hat: torch.Tensor,
    x: torch.Tensor,
    train_idx: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    cfg: Mapping[str, Any],
    seed: int,
    progress: bool = False,
    engine: Engine = LOOP,
    name: str = "expert",
) -> tuple[Expert, list[float]]:
    """Train (p_t, φ_t) on one task graph: CE + λ_c compactness + λ_s consistency + λ_e energy margin
    (spec §2.2 step 5). `x` and `a_hat` are the task's own graph, `y` the local labels 0..n_classes-1
    of `train_idx`. The backbone stays frozen; the fingerprint is taken from its unprompted embeddings. `engine`
    is the `train.engine` (paperflow.safer.fitting; `name` names a Lightning fit's logs)."""
    reject_unknown(cfg, EXPERT_KEYS, "safer expert")
    with torch.no_grad():
        z0 = backbone(a_hat, x)[train_idx]
    fp = fingerprint(z0, cfg["energy_share"], cfg["max_rank"])
    rho_scale = float(residual(z0, fp).mean().clamp_min(1e-6 * z0.var(0).sum()))
    torch.manual_seed(seed)
    expert = Expert(x.shape[1], fp, n_classes, cfg, rho_scale)
    opt = torch.optim.Adam(
        [p for p in expert.parameters() if p.requires_grad], lr=cfg["lr"], weight_decay=cfg["weight_decay"]
    )
    reg = cfg["regularizer"]
    margin = None

    def step(epoch: int, data: Mapping[str, Any]) -> torch.Tensor:
        nonlocal margin
        z = expert.embed(backbone, data["a_hat"], data["x"])[data["train_idx"]]
        logits = expert.logits(z)
        loss = F.cross_entropy(logits, data["y"])
        if reg["compactness"]:
            loss = loss + reg["compactness"] * compactness(reshape(z, expert.fingerprint, expert.mode), data["y"])
        if reg["consistency"]:
            loss = loss + reg["consistency"] * expert.scaled_residual(z).mean()
        if reg["energy"]:
            energy = expert.energy(z, logits)
            if epoch == reg["warmup"]:
                margin = energy.detach().median()
            if margin is not None:
                loss = loss + reg["energy"] * F.relu(energy - margin).pow(2).mean()
        return loss

    data = {"a_hat": a_hat, "x": x, "train_idx": train_idx, "y": y}
    losses = fit_steps(step, data, [expert, backbone], opt, cfg["epochs"], "expert", progress, engine, name)
    expert.requires_grad_(False)
    return expert.eval(), losses
