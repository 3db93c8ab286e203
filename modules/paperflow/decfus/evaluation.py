"""The evaluate stage: per (dataset, partition), one row per (method, seed) with the spec §8 metrics:
final accuracy (mean of the last evaluations), best accuracy, test loss, and the accuracy of the
clients' models after the last fusion (re-scored from the checkpoints)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import torch

from paperflow.decfus.clients import make_clients, test_metrics
from paperflow.decfus.nets import build_network
from paperflow.decfus.simulation import pick_device
from paperflow.decfus.training import load_split


def curve_metrics(curves: pd.DataFrame, clients: pd.DataFrame, tail: int) -> dict[str, float]:
    last = curves.tail(tail)
    out = {
        "final_acc": float(last.test_acc.mean()),
        "best_acc": float(curves.test_acc.max()),
        "final_loss": float(last.test_loss.mean()),
        "final_consensus": float(curves.consensus.iloc[-1]),
        "theta_final_max": float(clients[clients["round"] == clients["round"].max()].theta.max()),
        "stable_fraction": float(clients.groupby("client").stable_round.last().notna().mean()),
    }
    frac = clients.groupby("round").averaged_fraction.mean()
    out["averaged_first"] = float(frac.iloc[0])
    out["averaged_last"] = float(frac.iloc[-1])
    return out


@torch.no_grad()
def fused_accuracy(checkpoint: str, x_test: np.ndarray, y_test: np.ndarray, backend: str, batch_size: int, device: str) -> float:
    dev = pick_device(device)
    ckpt = torch.load(checkpoint, map_location=dev, weights_only=False)
    net = build_network(ckpt["model"], x_test.shape[1:], ckpt["classes"]).to(dev)
    acc, _ = test_metrics(make_clients(net, backend), ckpt["states"], torch.as_tensor(x_test, device=dev),
                          torch.as_tensor(y_test, device=dev), batch_size)
    return float(acc.mean())


def evaluate(runs: Iterable[Mapping[str, Any]], test_file: str, tail: int, backend: str, batch_size: int, device: str) -> pd.DataFrame:
    """`runs`: dicts with method, seed, curves, clients, checkpoint (paths)."""
    x_test, y_test, _ = load_split(test_file)
    rows = []
    for run in runs:
        row = {"method": run["method"], "seed": int(run["seed"])}
        row |= curve_metrics(pd.read_csv(run["curves"]), pd.read_csv(run["clients"]), tail)
        row["fused_acc"] = fused_accuracy(run["checkpoint"], x_test, y_test, backend, batch_size, device)
        rows.append(row)
    return pd.DataFrame(rows)
