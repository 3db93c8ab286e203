"""Evaluate trained models: test loss under distribution shift (uncertain least squares) or clean,
FGSM and PGD accuracy per attack radius (classifiers). Spec section 8."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.dro_flow.attacks import accuracy, fgsm, pgd
from paperflow.dro_flow.problems import Problem

log = logging.getLogger(__name__)

ATTACK_SEED_OFFSET = 10_000  # PGD random starts use seed + this offset


def delta_grid(cfg: dict[str, Any]) -> np.ndarray:
    return np.linspace(0.0, cfg["delta_max"], cfg["delta_steps"])


def shift_losses(problem: Problem, model: torch.nn.Module, u_test: np.ndarray, deltas: np.ndarray) -> np.ndarray:
    """Mean test loss at each Delta, on xi = (1 + Delta) u with u ~ U[-0.5, 0.5] (common draws)."""
    u = torch.as_tensor(u_test, dtype=torch.float64).reshape(1, -1, 1)
    with torch.no_grad():
        return np.array([float(problem.loss(model, (1.0 + d) * u, torch.zeros(1)).mean()) for d in deltas])


def attack_accuracies(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: dict[str, Any], seed: int
) -> list[dict[str, Any]]:
    gen = torch.Generator().manual_seed(seed + ATTACK_SEED_OFFSET)
    rows = [{"metric": "clean_acc", "level": 0.0, "value": accuracy(model, x, y)}]
    unit = float(x.norm(dim=1).mean()) if cfg["radius_relative"] else 1.0  # CIFAR: radius x mean feature norm
    for level in cfg["radii"]:
        r = level * unit
        alpha = cfg["pgd_alpha"] if cfg["pgd_alpha"] is not None else r / 8.0
        rows.append(
            {
                "metric": "fgsm_acc",
                "level": float(level),
                "value": accuracy(model, fgsm(model, x, y, r, cfg["norm"]), y),
            }
        )
        x_adv = pgd(model, x, y, r, cfg["norm"], cfg["pgd_steps"], alpha, gen)
        rows.append({"metric": "pgd_acc", "level": float(level), "value": accuracy(model, x_adv, y)})
    return rows


def load_models(problem: Problem, checkpoint: str | Path) -> dict[int, torch.nn.Module]:
    states = torch.load(checkpoint, map_location="cpu", weights_only=True)
    models = {}
    for seed, state in states.items():
        model = problem.build(int(seed))
        model.load_state_dict(state)
        model.eval()
        models[int(seed)] = model
    return models


def evaluate(
    problem: Problem, test: pd.DataFrame, checkpoints: Sequence[tuple[str, str]], cfg: dict[str, Any]
) -> pd.DataFrame:
    """One long frame (method, seed, metric, level, value) over every method's checkpoint."""
    cols = [c for c in test.columns if c.startswith("x")]
    rows = []
    for method, path in checkpoints:
        for seed, model in load_models(problem, path).items():
            if cfg["kind"] == "shift":
                deltas = delta_grid(cfg)
                values = shift_losses(problem, model, test[cols[0]].to_numpy(), deltas)
                rows += [
                    {"method": method, "seed": seed, "metric": "test_loss", "level": float(d), "value": float(v)}
                    for d, v in zip(deltas, values)
                ]
            else:
                x = torch.as_tensor(test[cols].to_numpy(), dtype=problem.x.dtype)
                y = torch.as_tensor(test["y"].to_numpy(), dtype=torch.long)
                rows += [{"method": method, "seed": seed, **r} for r in attack_accuracies(model, x, y, cfg, seed)]
            log.info("evaluated %s seed %d", method, seed)
    return pd.DataFrame(rows)
