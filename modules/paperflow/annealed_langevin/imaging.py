"""Paper-scale imaging experiment (spec §2): inpainting with 80 % of the pixels masked, posterior
sampling by time-inhomogeneous Langevin with a pretrained diffusion-model prior.

    b(x, tau) = -(x - D(x, sigma)) / tau - lam * mask * (x - x_obs),   sigma = sqrt(tau / (1 - tau)),

D the denoiser (deepinv's DiffUNet in the official code), a running posterior mean after burn-in.
ULA keeps tau = sigma_final; the diffusion path uses tau(t) = sigma_f + exp(-t/T)(1 - sigma_f - 1e-3).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from matplotlib import image as mpimg
from scipy.ndimage import gaussian_filter

from paperflow.core import plots
from paperflow.core.config import reject_unknown
from paperflow.core.loop import LoopCheckpoint, run_loop
from paperflow.core.resume import EVERY_S

IMAGING_KEYS = ("downsample", "mask_rate", "mask_seed", "lam", "step", "n_iter", "burn_in", "sigma_final")

IMAGING_PATHS = ("ula", "diffusion")


def imaging_taus(path: str, T: float | None, n_iter: int, step: float, sigma_final: float) -> torch.Tensor:
    t = torch.arange(n_iter, dtype=torch.float64) * step
    if path == "ula":
        return torch.full_like(t, sigma_final)
    if path == "diffusion":
        return sigma_final + torch.exp(-t / T) * (1 - sigma_final - 1e-3)
    raise ValueError(f"unknown imaging path {path!r}; known: {', '.join(IMAGING_PATHS)}")


def prepare_image(rgb: np.ndarray, factor: int) -> np.ndarray:
    """(H, W, 3) in any range -> Gaussian-filtered, downsampled by `factor`, rescaled to [0, 1], (3, h, w)."""
    img = np.asarray(rgb, dtype=np.float64)
    img = np.stack([gaussian_filter(img[..., c], sigma=factor / 2.0)[::factor, ::factor] for c in range(img.shape[-1])])
    return (img - img.min()) / (img.max() - img.min())


def inpainting_mask(shape: tuple[int, ...], rate: float, seed: int) -> torch.Tensor:
    """1 where a pixel is observed (probability 1 - rate), shared by the colour channels."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((1, 1, *shape[-2:]), generator=gen) > rate).double()


def psnr(x: torch.Tensor, ref: torch.Tensor) -> float:
    mse = float(((x.clamp(0, 1) - ref) ** 2).mean())
    return 10 * math.log10(1.0 / mse) if mse > 0 else float("inf")


class Chain:
    """The sampler's state between iterations (iterate, running mean, kept count, noise generator), with
    state_dict/load_state_dict for LoopCheckpoint."""

    def __init__(self, x: torch.Tensor, seed: int) -> None:
        self.x, self.mean, self.kept = x, torch.zeros_like(x), 0
        self.gen = torch.Generator(device=x.device).manual_seed(seed)

    def state_dict(self) -> dict:
        return {"x": self.x, "mean": self.mean, "kept": self.kept, "gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.x, self.mean = state["x"].to(self.x), state["mean"].to(self.mean)
        self.kept = int(state["kept"])
        self.gen.set_state(state["gen"])


def posterior_langevin(
    x_obs: torch.Tensor,
    mask: torch.Tensor,
    denoiser: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    taus: torch.Tensor,
    step: float,
    lam: float,
    burn_in: int,
    seed: int,
    progress: bool = True,
    checkpoint_dir: str | Path | None = None,
    every_s: float = EVERY_S,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(running posterior mean after burn_in, last iterate); starts at mask * x_obs. With `checkpoint_dir` (the
    job's checkpoint folder) the chain is saved there every `every_s` seconds and a rerun continues from it."""
    chain = Chain(mask * x_obs, seed)

    def iterate(n: int) -> float:
        tau = taus[n].to(chain.x)
        x = chain.x
        with torch.no_grad():
            prior = -(x - denoiser(x, torch.sqrt(tau / (1 - tau)))) / tau
        chain.x = (
            x
            + step * (prior - lam * mask * (x - x_obs))
            + math.sqrt(2 * step) * torch.randn(x.shape, generator=chain.gen, device=x.device, dtype=x.dtype)
        )
        if n >= burn_in:
            chain.kept += 1
            chain.mean += (chain.x - chain.mean) / chain.kept
        return float(chain.kept)

    checkpoint = None if checkpoint_dir is None else LoopCheckpoint(checkpoint_dir, {"chain": chain}, every_s)
    run_loop(iterate, None, len(taus), desc="imaging", progress=progress, checkpoint=checkpoint)
    return chain.mean, chain.x


def diffunet_denoiser(weights: str, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """deepinv's DiffUNet (FFHQ, small model) with the downloaded weights. deepinv (which needs
    torchvision) is needed only here, at paper scale: it lives in envs/imaging.yaml, not in the
    local venv, and is imported on use."""
    import deepinv as dinv

    model = dinv.models.DiffUNet(large_model=False, pretrained=weights).to(device).eval()
    return lambda x, sigma: model(x.float(), sigma.float()).to(x.dtype)


def run_inpainting(
    image_path: str,
    weights_path: str,
    path: str,
    T: float | None,
    cfg: dict,
    device: torch.device,
    metrics_out: str,
    figure_out: str,
    checkpoint_dir: str | Path | None = None,
) -> dict:
    """One (path, horizon) of the inpainting experiment: writes metrics JSON and a figure; returns the metrics.
    `checkpoint_dir`: the job's checkpoint folder, where the chain is saved every 30 min and resumed from."""
    reject_unknown(cfg, IMAGING_KEYS, "annealed_langevin imaging config")
    x_true = torch.from_numpy(prepare_image(mpimg.imread(image_path)[..., :3], cfg["downsample"]))[None].to(device)
    mask = inpainting_mask(tuple(x_true.shape), cfg["mask_rate"], cfg["mask_seed"]).to(device)
    taus = imaging_taus(path, T, cfg["n_iter"], cfg["step"], cfg["sigma_final"])
    denoiser = diffunet_denoiser(weights_path, device)
    mean, last = posterior_langevin(
        x_true,
        mask,
        denoiser,
        taus,
        cfg["step"],
        cfg["lam"],
        cfg["burn_in"],
        cfg["mask_seed"],
        checkpoint_dir=checkpoint_dir,
    )
    summary = {
        "path": path,
        "T": "inf" if T is None else T,
        "iterations": cfg["n_iter"],
        "psnr_posterior_mean": psnr(mean, x_true),
        "psnr_last": psnr(last, x_true),
        "psnr_observed": psnr(mask * x_true, x_true),
        "shape": list(x_true.shape),
    }
    with open(metrics_out, "w") as fh:
        json.dump(summary, fh, indent=2)
    fig, axes = plots.subplots(3)
    for ax, (title, img) in zip(axes, [("observed", mask * x_true), ("posterior mean", mean), ("truth", x_true)]):
        ax.imshow(img[0].clamp(0, 1).permute(1, 2, 0).cpu().numpy())
        ax.set_title(title)
        ax.axis("off")
    plots.save(fig, figure_out)
    return summary
