"""The data stages: acquire a dataset as one graph (`download`), cut it into the open-set
class-incremental task sequence (`preprocess`), and pretrain each seed's frozen backbone (`pretrain`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.datasets import load_digits

from paperflow.core.config import reject_unknown
from paperflow.core.download import pinned_fetch
from paperflow.safer.backbone import pretrain_grace
from paperflow.safer.fitting import LOOP, Engine
from paperflow.safer.graph import knn_graph, submatrix
from paperflow.safer.settings import NEEDS
from paperflow.safer.sources import Graph, drop_classes, load_graph, read_source, save_graph
from paperflow.safer.tasks import TaskGraph, build_task_graph, load_task_graph, save_task_graph
from paperflow.safer.training import save_states

log = logging.getLogger(__name__)


def digits_graph(name: str, k: int, noise: float, noise_seed: int) -> Graph:
    """The smoke stand-in (spec §4): scikit-learn's digits, standardised features (plus Gaussian noise
    of std `noise` for the harder variant), symmetric cosine kNN graph."""
    data = load_digits()
    x = data.data.astype(np.float64)
    x = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)
    if noise:
        x = x + noise * np.random.default_rng(noise_seed).standard_normal(x.shape)
    return Graph(
        features=x.astype(np.float32), labels=data.target.astype(np.int64), adjacency=knn_graph(x, k), name=name
    )


PROTOCOL_KEYS = ("classes_per_task", "split", "split_seed", "holdout_fraction")


def acquire(name: str, spec: Mapping[str, Any], cache_dir: str | Path) -> Graph:
    """One dataset as a graph; `spec` is its `datasets` entry without `class_order` (a preprocess key)."""
    reject_unknown(spec, ("kind", *NEEDS[spec["kind"]]), f"datasets.{name}")
    if spec["kind"] == "digits":
        return digits_graph(name, spec["knn"], spec["noise"], spec["noise_seed"])
    path = pinned_fetch(spec["url"], Path(cache_dir) / Path(spec["url"]).name, spec["sha256"], slug="safer",
                        key=f"datasets.{name}.sha256")  # fmt: skip
    graph = read_source(spec["kind"], path, name)
    return drop_classes(graph, spec["drop_classes"]) if spec["drop_classes"] else graph


def download(name: str, spec: Mapping[str, Any], cache_dir: str | Path, out: str | Path) -> dict[str, int]:
    graph = acquire(name, spec, cache_dir)
    save_graph(graph, out)
    return {
        "nodes": len(graph.labels),
        "edges": int(graph.adjacency.nnz // 2),
        "features": int(graph.features.shape[1]),
        "classes": int(graph.labels.max() + 1),
    }


def preprocess(
    raw: str | Path, class_order: Sequence[int] | None, protocol: Mapping[str, Any], out: str | Path
) -> dict[str, Any]:
    """The task sequence of one dataset; classes in `class_order`, or in id order (CGLB's default) when None."""
    reject_unknown(protocol, PROTOCOL_KEYS, "safer protocol")
    graph = load_graph(raw)
    order = list(class_order or range(int(graph.labels.max()) + 1))
    tasks = build_task_graph(
        graph.features,
        graph.labels,
        graph.adjacency,
        name=graph.name,
        class_order=order,
        classes_per_task=protocol["classes_per_task"],
        holdout_fraction=protocol["holdout_fraction"],
        split_fractions=protocol["split"],
        split_seed=protocol["split_seed"],
    )
    save_task_graph(tasks, out)
    info = {
        "tasks": len(tasks.task_classes),
        "learned": tasks.learned,
        "class_order": [int(c) for c in order],
        "edges_kept": int(tasks.adjacency.nnz // 2),
        "edges_dropped_between_tasks": int((graph.adjacency.nnz - tasks.adjacency.nnz) // 2),
    }
    log.info("%s: %s", graph.name, info)
    return info


def first_task(tasks: TaskGraph) -> tuple[np.ndarray, sp.csr_matrix]:
    """Features and adjacency of the first task's graph: the only data the backbone ever sees."""
    nodes = tasks.nodes(0)
    return tasks.features[nodes], submatrix(tasks.adjacency, nodes)


def pretrain(
    tasks_file: str | Path,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    out: str | Path,
    losses_out: str | Path,
    progress: bool = False,
    engine: Engine = LOOP,
) -> dict[int, float]:
    """One GRACE-pretrained SGC per seed on the first task's graph only (spec §2.2 step 0); `engine`: the
    `train.engine` (paperflow.safer.fitting)."""
    x, adj = first_task(load_task_graph(tasks_file))
    states, rows = {}, []
    for seed in seeds:
        encoder, losses = pretrain_grace(x, adj, cfg, seed, progress, engine)
        states[seed] = encoder.state_dict()
        rows += [{"seed": seed, "epoch": e, "loss": l} for e, l in enumerate(losses)]
        log.info("seed %d: GRACE loss %.4f -> %.4f", seed, losses[0], losses[-1])
    save_states(out, states, {"k": cfg["k"], "hidden": cfg["hidden"]})
    pd.DataFrame(rows).to_csv(losses_out, index=False)
    return {r["seed"]: r["loss"] for r in rows}  # the last epoch's loss of each seed
