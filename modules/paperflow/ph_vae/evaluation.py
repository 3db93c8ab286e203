"""Evaluate trained models of one dataset: prior samples, tail metrics, dependence, test ELBO."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.ph_vae.checkpoint import load_vae
from paperflow.ph_vae.data import truth_distribution
from paperflow.ph_vae.metrics import dependence_metrics, tail_summary
from paperflow.ph_vae.model import VAE

log = logging.getLogger(__name__)
SAMPLE_SEED_OFFSET = 10_000  # prior samples of seed s use torch seed 10_000 + s, apart from training


def prior_samples(vae: VAE, n: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(SAMPLE_SEED_OFFSET + seed)
    with torch.no_grad():
        return vae.sample(n, gen).double().numpy()


def test_terms(vae: VAE, x_test: np.ndarray, seed: int) -> dict[str, float]:
    """Test negative ELBO in nats per dimension and the mean KL (one z sample, seeded)."""
    torch.manual_seed(SAMPLE_SEED_OFFSET + seed)
    with torch.no_grad():
        terms = vae.elbo_terms(torch.as_tensor(x_test, dtype=torch.float32))
    nelbo = -(terms["recon"] - vae.beta * terms["kl"]).mean().item()
    return {"test_nelbo_per_dim": nelbo / x_test.shape[1], "test_kl": terms["kl"].mean().item()}


def model_metrics(
    samples: np.ndarray, x_test: np.ndarray, x_all: np.ndarray, truth: dict[str, Any], tail_q: float, min_tail: int
) -> list[dict[str, Any]]:
    """Long-format rows (dim, metric, value); dim = -1 for the joint (dependence) metrics."""
    rows = []
    for j in range(samples.shape[1]):
        summary = tail_summary(samples[:, j], truth_distribution(truth, j), x_test[:, j], q=tail_q, min_tail=min_tail)
        rows += [{"dim": j, "metric": k, "value": v} for k, v in summary.items()]
    if samples.shape[1] > 1:
        rows += [{"dim": -1, "metric": k, "value": v} for k, v in dependence_metrics(x_all, samples).items()]
    return rows


def evaluate(
    *,
    checkpoints: Iterable[tuple[str, int, str]],
    x_test: np.ndarray,
    x_all: np.ndarray,
    truth: dict[str, Any],
    n_samples: int,
    tail_q: float,
    min_tail: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Metrics of every (decoder, seed, checkpoint) and the prior samples they were computed on."""
    metric_rows, sample_frames = [], []
    for decoder, seed, ckpt in checkpoints:
        vae = load_vae(ckpt)
        samples = prior_samples(vae, n_samples, seed)
        rows = model_metrics(samples, x_test, x_all, truth, tail_q, min_tail)
        rows += [{"dim": -1, "metric": k, "value": v} for k, v in test_terms(vae, x_test, seed).items()]
        metric_rows += [r | {"decoder": decoder, "seed": seed} for r in rows]
        kept = pd.DataFrame(samples, columns=[f"x{j}" for j in range(samples.shape[1])])
        sample_frames.append(kept.assign(decoder=decoder, seed=seed))
        log.info(
            "evaluated %s seed %d: %s",
            decoder,
            seed,
            {
                r["metric"]: round(r["value"], 4)
                for r in rows
                if r["dim"] == 0 and r["metric"] in ("ks_tail@0.95", "q99_rel")
            },
        )
    metrics = pd.DataFrame(metric_rows)[["decoder", "seed", "dim", "metric", "value"]]
    return metrics, pd.concat(sample_frames, ignore_index=True)
