"""The train stage: one decentralised run of one method on one (dataset, partition, seed)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.io import read_frame
from paperflow.decfus.data import from_frame, normalise
from paperflow.decfus.prepare import read_partition
from paperflow.decfus.simulation import simulate
from paperflow.decfus.topology import check_topology, paper_topology

log = logging.getLogger(__name__)

ENGINES = ("loop", "lightning")


def load_split(path: str | Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    frame, meta = read_frame(path)
    pixels, labels = from_frame(frame, meta["normalisation"]["shape"])
    return normalise(pixels, meta["normalisation"]), labels, meta


def train_run(
    *,
    method: str,
    train_file: str,
    test_file: str,
    partition_files: Mapping[int, str],
    seeds: list[int],
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    decfus: Mapping[str, Any],
    out: Mapping[str, str],
    run_dir: str | Path | None = None,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    checkpoint_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run `method` once per seed (seed s on the clients of partition_files[s]); write the curves and
    per-client logs of all seeds (column `seed`) and one checkpoint with every seed's final states.
    train["engine"]: `loop` (the plain torch loop) or `lightning` (the same loop under Lightning Fabric,
    paperflow.decfus.lightning, logging to run_dir/csv/<method> and wandb when enabled). `checkpoint_dir`: the
    job's checkpoint folder, where each seed's run saves its state (checkpoint_dir/seed<s>) and resumes from."""
    engine = train["engine"]
    if engine == "loop":
        fabric = None
    elif engine == "lightning":
        from paperflow.core.training import make_fabric, make_loggers

        if run_dir is None:
            raise ValueError("train.engine = 'lightning' needs a run_dir for its loggers")
        fabric = make_fabric(make_loggers(run_dir, method, wandb, tags or {}), accelerator=train["device"])
    else:
        raise ValueError(f"train.engine = {engine!r}: not one of {ENGINES}")
    x_train, y_train, meta = load_split(train_file)
    x_test, y_test, _ = load_split(test_file)
    neighbours = paper_topology()
    check_topology(neighbours)
    curves, clients, states, walls = [], [], {}, {}
    for seed in seeds:
        partition_file = partition_files[seed]
        parts = read_partition(partition_file)
        if len(parts) != len(neighbours):
            raise ValueError(f"{partition_file} has {len(parts)} clients; the topology has {len(neighbours)}")
        t0 = time.perf_counter()
        result = simulate(
            method=method,
            x_train=x_train,
            y_train=y_train,
            x_test=x_test,
            y_test=y_test,
            parts=parts,
            neighbours=neighbours,
            classes=meta["classes"],
            model=model,
            train=train,
            decfus=decfus,
            seed=seed,
            progress=sys.stderr.isatty(),
            fabric=fabric,
            checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir) / f"seed{seed}",
        )
        walls[seed] = round(time.perf_counter() - t0, 3)
        curves.append(result.curves.assign(seed=seed))
        clients.append(result.clients.assign(seed=seed))
        states[seed] = result.states
        log.info(
            "%s seed %d: %d rounds in %.1f s; last test acc %.4f",
            method,
            seed,
            train["rounds"],
            walls[seed],
            result.curves.test_acc.iloc[-1],
        )
    pd.concat(curves).to_csv(out["curves"], index=False)
    pd.concat(clients).to_csv(out["clients"], index=False)
    checkpoint = {"method": method, "model": dict(model), "classes": meta["classes"], "states": states}
    if fabric is None:
        torch.save(checkpoint, out["checkpoint"])
        return {"simulation_s": walls, "engine": engine}
    from paperflow.core.training import finish_fabric

    fabric.save(out["checkpoint"], checkpoint)
    return {"simulation_s": walls} | finish_fabric(fabric)
