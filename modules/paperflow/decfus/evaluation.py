"""The evaluate stage: per (dataset, partition), one row per (method, seed) with the spec §8 metrics:
final accuracy (mean of the last evaluations), best accuracy, test loss, and the accuracy of the
clients' models after the last fusion (re-scored from the checkpoints)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.resume import row_journal
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
def fused_accuracy(
    checkpoint: str, x_test: np.ndarray, y_test: np.ndarray, backend: str, batch_size: int, device: str
) -> dict[int, float]:
    """Client-mean test accuracy of the models after the last fusion, per seed in the checkpoint."""
    dev = pick_device(device)
    ckpt = torch.load(checkpoint, map_location=dev, weights_only=False)
    clients = make_clients(build_network(ckpt["model"], x_test.shape[1:], ckpt["classes"]).to(dev), backend)
    x, y = torch.as_tensor(x_test, device=dev), torch.as_tensor(y_test, device=dev)
    return {
        int(seed): float(test_metrics(clients, states, x, y, batch_size)[0].mean())
        for seed, states in ckpt["states"].items()
    }


def evaluate(
    runs: Iterable[Mapping[str, Any]],
    test_file: str,
    tail: int,
    backend: str,
    batch_size: int,
    device: str,
    journal: str | Path | None = None,
) -> pd.DataFrame:
    """One row per (method, seed); `runs`: dicts with method, curves, clients, checkpoint (paths of one training job).
    Each evaluated run's rows are a row of the `journal` (a file in the job's checkpoint folder; a scratch file when
    None), as JSON text: a rerun of a killed job evaluates only the runs left and returns the same frame."""
    x_test, y_test, _ = load_split(test_file)
    rows = []
    with row_journal(journal) as done:
        for run in runs:
            if run["checkpoint"] not in done:
                done.append({"id": run["checkpoint"], "rows": json.dumps(_run_rows(run, x_test, y_test, tail,
                                                                                  backend, batch_size, device))})  # fmt: skip
            (row,) = done.complete([run["checkpoint"]])
            rows += json.loads(row["rows"])  # fresh or from before a kill: the same JSON
    return pd.DataFrame(rows)


def _run_rows(
    run: Mapping[str, Any],
    x_test: np.ndarray,
    y_test: np.ndarray,
    tail: int,
    backend: str,
    batch_size: int,
    device: str,
) -> list[dict[str, Any]]:
    curves, clients = pd.read_csv(run["curves"]), pd.read_csv(run["clients"])
    fused = fused_accuracy(run["checkpoint"], x_test, y_test, backend, batch_size, device)
    rows = []
    for seed, c in curves.groupby("seed"):
        row = {"method": run["method"], "seed": int(seed)}
        row |= curve_metrics(c, clients[clients.seed == seed], tail)
        rows.append(row | {"fused_acc": fused[int(seed)]})
    return rows
