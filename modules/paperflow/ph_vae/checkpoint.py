"""Build a VAE from config and restore one from a Lightning checkpoint (torch only, no Lightning import)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from paperflow.ph_vae.model import VAE, IndependentVAE

INDEPENDENT = "ph_indep"  # the ablation: one PH-VAE per coordinate (model.IndependentVAE)


def build_vae(input_dim: int, decoder: str, model: Mapping[str, Any]) -> VAE | IndependentVAE:
    options = {
        "encoder_hidden": tuple(model["encoder_hidden"]),
        "decoder_hidden": tuple(model["decoder_hidden"]),
        "n_phases": model["n_phases"],
        "beta": model["beta"],
        "likelihood": model["likelihood"],
    }
    if decoder == INDEPENDENT:
        return IndependentVAE(input_dim, model["latent_dim"], **options)
    return VAE(input_dim=input_dim, latent_dim=model["latent_dim"], decoder=decoder, **options)


def load_vae(checkpoint: str | Path) -> VAE | IndependentVAE:
    """The trained VAE saved by `Trainer.save_checkpoint` (its weights live under the `vae.` prefix)."""
    state = torch.load(str(checkpoint), map_location="cpu", weights_only=False)
    hp = state["hyper_parameters"]
    vae = build_vae(hp["input_dim"], hp["decoder"], hp["model"])
    vae.load_state_dict({k.removeprefix("vae."): v for k, v in state["state_dict"].items()})
    return vae.eval()
