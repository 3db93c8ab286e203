"""Build a target mixture from its config block (the download stage; torch only for the official n-D draw)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from paperflow.annealed_langevin.gmm import GMM
from paperflow.core.config import reject_unknown

SPEC_KEYS = ("means", "stds", "weights", "random")


def official_random_gmm(
    dim: int, n_modes: int, std_low: float, std_high: float, weights: list[float], seed: int
) -> GMM:
    """The n-D target exactly as the official script draws it: torch.manual_seed(seed), means =
    randn(K, d), stds = rand(K, d) * (high - low) + low (float32 draws, kept as float64)."""
    import torch

    torch.manual_seed(seed)
    means = torch.randn(n_modes, dim)
    stds = torch.rand(n_modes, dim) * (std_high - std_low) + std_low
    return GMM(means.double().numpy(), stds.double().numpy(), np.asarray(weights, dtype=np.float64))


def build_target(spec: Mapping[str, Any]) -> GMM:
    """An explicit mixture (means, stds, weights) or the official random n-D one (`random` block, the
    means and stds null)."""
    reject_unknown(spec, SPEC_KEYS, "annealed_langevin target spec")
    if spec["random"] is not None:
        r = spec["random"]
        return official_random_gmm(
            r["dim"], len(spec["weights"]), r["std_low"], r["std_high"], spec["weights"], r["seed"]
        )
    return GMM(np.asarray(spec["means"]), np.asarray(spec["stds"]), np.asarray(spec["weights"]))
