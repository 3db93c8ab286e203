"""The open-set class-incremental protocol (spec §2.1): classes cut into tasks of `classes_per_task`,
a per-class train/val/test split, no inter-task edges, and the unknowns of each stage.

A `TaskGraph` holds the whole dataset once: features, labels, the block-diagonal adjacency (each task
graph is its own block, so one propagation embeds every node inside its own task graph, as the
protocol requires for unknown nodes too), and per node its task and split. Tasks 0..K-1 are learned
in order; tasks K.. hold the held-out classes, never learned, whose nodes are unknown at every stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from paperflow.safer.graph import within_groups

TRAIN, VAL, TEST = 0, 1, 2


@dataclass(frozen=True)
class TaskGraph:
    features: np.ndarray  # (n, d) float32
    labels: np.ndarray  # (n,) int64, the dataset's class ids
    adjacency: sp.csr_matrix  # (n, n) binary, edges only inside a task
    task: np.ndarray  # (n,) int64: task index, -1 for nodes of no task
    split: np.ndarray  # (n,) int64: TRAIN / VAL / TEST, -1 outside tasks
    task_classes: np.ndarray  # (T, classes_per_task) class ids of each task, learned ones first
    learned: int  # K: tasks 0..K-1 are learned, K..T-1 are held out (never learned)
    name: str

    @property
    def num_classes(self) -> int:
        return int(self.task_classes[: self.learned].size)

    def nodes(self, task: int, split: int | None = None) -> np.ndarray:
        mask = self.task == task
        if split is not None:
            mask &= self.split == split
        return np.flatnonzero(mask)

    def seen_classes(self, stage: int) -> np.ndarray:
        """Classes learned by the end of stage `stage` (0-based), in learning order."""
        return self.task_classes[: stage + 1].reshape(-1)


def assign_tasks(
    labels: np.ndarray, class_order: Sequence[int], classes_per_task: int, holdout_fraction: float
) -> tuple[np.ndarray, int]:
    """(task_classes, K): consecutive groups of `class_order`; the last `holdout_fraction` of the
    classes (rounded down to whole tasks) are held out and never learned."""
    order = np.asarray(class_order, dtype=np.int64)
    present = np.unique(labels)
    if sorted(order.tolist()) != present.tolist():
        raise ValueError(
            f"class_order must list every class of the data exactly once; the data has {present.tolist()}, "
            f"class_order has {order.tolist()}"
        )
    if len(order) % classes_per_task:
        raise ValueError(f"{len(order)} classes do not split into tasks of {classes_per_task}")
    tasks = order.reshape(-1, classes_per_task)
    held = int(np.floor(holdout_fraction * len(tasks) + 1e-9))
    if held >= len(tasks) - 1:
        raise ValueError(f"holdout_fraction {holdout_fraction} leaves fewer than 2 learned tasks of {len(tasks)}")
    return tasks, len(tasks) - held


def split_nodes(labels: np.ndarray, fractions: Sequence[float], seed: int) -> np.ndarray:
    """Per-class random TRAIN/VAL/TEST codes with the given fractions (train, val; test the rest)."""
    rng = np.random.default_rng(seed)
    split = np.full(len(labels), TEST, dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_train = int(round(fractions[0] * len(idx)))
        n_val = int(round(fractions[1] * len(idx)))
        split[idx[:n_train]] = TRAIN
        split[idx[n_train : n_train + n_val]] = VAL
    return split


def build_task_graph(
    features: np.ndarray,
    labels: np.ndarray,
    adjacency: sp.csr_matrix,
    *,
    name: str,
    class_order: Sequence[int],
    classes_per_task: int,
    holdout_fraction: float,
    split_fractions: Sequence[float],
    split_seed: int,
) -> TaskGraph:
    task_classes, learned = assign_tasks(labels, class_order, classes_per_task, holdout_fraction)
    class_task = np.full(int(labels.max()) + 1, -1, dtype=np.int64)
    for t, classes in enumerate(task_classes):
        class_task[classes] = t
    task = class_task[labels]
    return TaskGraph(
        features=np.asarray(features, dtype=np.float32),
        labels=np.asarray(labels, dtype=np.int64),
        adjacency=within_groups(adjacency, task),
        task=task,
        split=split_nodes(labels, split_fractions, split_seed),
        task_classes=task_classes,
        learned=learned,
        name=name,
    )


def save_task_graph(g: TaskGraph, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    adj = g.adjacency
    with open(path, "wb") as fh:
        np.savez_compressed(
            fh,
            features=g.features,
            labels=g.labels,
            adj_indptr=adj.indptr,
            adj_indices=adj.indices,
            adj_shape=np.asarray(adj.shape),
            task=g.task,
            split=g.split,
            task_classes=g.task_classes,
            learned=np.asarray(g.learned),
            name=np.asarray(g.name),
        )


def load_task_graph(path: str | Path) -> TaskGraph:
    with np.load(path, allow_pickle=False) as z:
        adj = sp.csr_matrix(
            (np.ones(len(z["adj_indices"]), dtype=np.float32), z["adj_indices"], z["adj_indptr"]),
            shape=tuple(z["adj_shape"]),
        )
        return TaskGraph(
            features=z["features"],
            labels=z["labels"],
            adjacency=adj,
            task=z["task"],
            split=z["split"],
            task_classes=z["task_classes"],
            learned=int(z["learned"]),
            name=str(z["name"]),
        )
