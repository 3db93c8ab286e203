"""The evaluate stage: after every stage t, predict every node among the classes seen so far (no task
ID), score how known it is (higher = more known), and measure accuracy per task, task-ID accuracy and
the open-set metrics against the test nodes of the not-yet-learned (and held-out) tasks.

Evaluation variants (the open-set add-on is chosen at evaluation, so one trained model serves several):
- `safer`: energy routing t̂ = argmin_t E_t, score −min_t E_t (spec §2.2 step 4);
- `tpp_msp`: TPP's prototype routing per node (nearest Â^k X prototype), max softmax of the routed head;
- `tpp_graph_msp`: TPP's own routing of a whole task graph (mean Â^k X of its test or validation nodes);
- `tpp_energy`: TPP experts with energy routing (SAFER without reshaping, residual or regulariser);
- `finetune_msp`, `finetune_energy`, `ewc_energy`, `ewc_msp`: the class-IL network's max softmax or
  negative free energy over the seen classes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import f1_score

from paperflow.core.io import write_frame
from paperflow.core.resume import RowJournal, row_journal
from paperflow.safer.experts import free_energy
from paperflow.safer.graph import gcn_norm, smooth, to_torch
from paperflow.safer.metrics import auroc, fpr_at_tpr, known_threshold
from paperflow.safer.settings import EXPERT_METHODS
from paperflow.safer.tasks import TEST, VAL, TaskGraph, load_task_graph
from paperflow.safer.training import (
    load_states,
    rebuild_backbone,
    rebuild_class_il,
    rebuild_expert,
    sub_state,
)


@dataclass(frozen=True)
class StageOutput:
    """Per node, after one stage: predicted class id, known-ness score, routed task (−1: no routing)."""

    pred: np.ndarray
    score: np.ndarray
    route: np.ndarray


def propagate_energy(energy: torch.Tensor, a_hat: torch.Tensor, steps: int, alpha: float) -> torch.Tensor:
    """GNNSafe's energy propagation E ← αE + (1−α)ÂE, `steps` times, for each expert's row of `energy`."""
    for _ in range(steps):
        energy = alpha * energy + (1 - alpha) * (a_hat @ energy.T).T
    return energy


@dataclass(frozen=True)
class ExpertOutputs:
    logits: torch.Tensor  # (K, n, classes per task)
    energy: torch.Tensor  # (K, n)


@torch.no_grad()
def expert_outputs(
    state: Mapping[str, torch.Tensor], graph: TaskGraph, a_hat: torch.Tensor, cfg: Mapping[str, Any], method: str
) -> ExpertOutputs:
    """Every expert on every node, each node embedded inside its own task graph."""
    backbone = rebuild_backbone(sub_state(state, "backbone"), cfg["k"])
    ecfg = cfg["expert"]
    x = torch.as_tensor(graph.features)
    logits, energy = [], []
    for t in range(graph.learned):
        expert = rebuild_expert(sub_state(state, f"expert{t}"), ecfg)
        z = expert.embed(backbone, a_hat, x)
        logits.append(expert.logits(z))
        energy.append(expert.energy(z, logits[-1]))
    prop = ecfg["energy_propagation"]
    return ExpertOutputs(
        torch.stack(logits), propagate_energy(torch.stack(energy), a_hat, prop["steps"], prop["alpha"])
    )


def routed(graph: TaskGraph, out: ExpertOutputs, route: np.ndarray, score: np.ndarray) -> StageOutput:
    nodes = np.arange(len(route))
    local = out.logits[route, nodes].argmax(-1).numpy()
    return StageOutput(pred=graph.task_classes[route, local], score=score, route=route)


def energy_routing(graph: TaskGraph, out: ExpertOutputs, stage: int) -> StageOutput:
    energy = out.energy[: stage + 1]
    best = energy.min(0)
    return routed(graph, out, best.indices.numpy(), -best.values.numpy())


def msp_of(graph: TaskGraph, out: ExpertOutputs, route: np.ndarray) -> StageOutput:
    probs = torch.softmax(out.logits[route, np.arange(len(route))], -1).max(-1).values.numpy()
    return routed(graph, out, route, probs)


def nearest_prototype(rows: np.ndarray, prototypes: np.ndarray) -> np.ndarray:
    """Index of the nearest prototype (Euclidean) of each row, via ‖p‖² − 2 x·p (no (n, K, d) array)."""
    return ((prototypes**2).sum(1)[None, :] - 2.0 * rows @ prototypes.T).argmin(1)


def graph_groups(graph: TaskGraph) -> np.ndarray:
    """A group id per node: one group per (task graph, split); −1 outside every task."""
    return np.where(graph.task >= 0, graph.task * 3 + graph.split, -1)


def prototype_routing(smoothed: np.ndarray, prototypes: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """Nearest prototype per node, or (TPP) per group of nodes by the group's mean smoothed feature."""
    if groups is None:
        return nearest_prototype(smoothed, prototypes)
    route = np.zeros(len(smoothed), dtype=np.int64)
    for g in np.unique(groups):
        members = groups == g
        route[members] = nearest_prototype(smoothed[members].mean(0, keepdims=True), prototypes)[0]
    return route


def expert_stage_outputs(
    method: str, state: Mapping[str, torch.Tensor], graph: TaskGraph, cfg: Mapping[str, Any]
) -> dict[str, list[StageOutput]]:
    a_sp = gcn_norm(graph.adjacency)
    out = expert_outputs(state, graph, to_torch(a_sp), cfg, method)
    stages = range(graph.learned)
    if method == "safer":
        return {"safer": [energy_routing(graph, out, s) for s in stages]}
    smoothed = smooth(a_sp, graph.features, cfg["prototype_k"])
    prototypes = np.stack([state[f"prototype{t}"].numpy() for t in range(graph.learned)])
    groups = graph_groups(graph)
    return {
        "tpp_msp": [msp_of(graph, out, prototype_routing(smoothed, prototypes[: s + 1], None)) for s in stages],
        "tpp_graph_msp": [msp_of(graph, out, prototype_routing(smoothed, prototypes[: s + 1], groups)) for s in stages],
        "tpp_energy": [energy_routing(graph, out, s) for s in stages],
    }


@torch.no_grad()
def class_il_stage_outputs(
    method: str, state: Mapping[str, torch.Tensor], graph: TaskGraph, cfg: Mapping[str, Any]
) -> dict[str, list[StageOutput]]:
    a_hat, x = to_torch(gcn_norm(graph.adjacency)), torch.as_tensor(graph.features)
    order = graph.seen_classes(graph.learned - 1)
    no_route = np.full(len(x), -1)
    msp, energy = [], []
    for s in range(graph.learned):
        seen = (s + 1) * graph.task_classes.shape[1]
        logits = rebuild_class_il(sub_state(state, f"stage{s}"), cfg["k"])(a_hat, x, seen)
        pred = order[logits.argmax(-1).numpy()]
        msp.append(StageOutput(pred, torch.softmax(logits, -1).max(-1).values.numpy(), no_route))
        energy.append(StageOutput(pred, -free_energy(logits, cfg["class_il"]["energy_temperature"]).numpy(), no_route))
    return {f"{method}_msp": msp, f"{method}_energy": energy}


def stage_outputs(
    method: str, state: Mapping[str, torch.Tensor], graph: TaskGraph, cfg: Mapping[str, Any]
) -> dict[str, list[StageOutput]]:
    if method in EXPERT_METHODS:
        return expert_stage_outputs(method, state, graph, cfg)
    return class_il_stage_outputs(method, state, graph, cfg)


def stage_metrics(
    graph: TaskGraph, out: StageOutput, stage: int, tpr: float
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Accuracy and task-ID accuracy per learned task j <= stage; the open-set row (None when no task is unknown)."""
    test, val = graph.split == TEST, graph.split == VAL
    acc = []
    for j in range(stage + 1):
        nodes = test & (graph.task == j)
        acc.append(
            {
                "stage": stage,
                "task": j,
                "acc": float(np.mean(out.pred[nodes] == graph.labels[nodes])),
                "task_id_acc": float(np.mean(out.route[nodes] == j)) if out.route[nodes][0] >= 0 else np.nan,
            }
        )
    known = test & (graph.task >= 0) & (graph.task <= stage)
    unknown = test & (graph.task > stage)
    if not unknown.any():
        return acc, None
    tau = known_threshold(out.score[val & (graph.task >= 0) & (graph.task <= stage)], tpr)
    accept = out.score >= tau
    truth = np.where(known, graph.labels, -1)[known | unknown]
    guess = np.where(accept, out.pred, -1)[known | unknown]
    return acc, {
        "stage": stage,
        "auroc": auroc(out.score[known], out.score[unknown]),
        "fpr95": fpr_at_tpr(out.score[known], out.score[unknown], tpr),
        "threshold": tau,
        "open_acc": float(np.mean(truth == guess)),
        "open_macro_f1": float(f1_score(truth, guess, average="macro")),
        "n_known": int(known.sum()),
        "n_unknown": int(unknown.sum()),
    }


def evaluate_states(
    method: str,
    states: Mapping[int, Mapping[str, torch.Tensor]],
    graph: TaskGraph,
    cfg: Mapping[str, Any],
    tpr: float,
    journal: RowJournal | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(accuracy rows, open-set rows) for every seed, evaluation variant and stage; `cfg` is the
    method's own config (`method_config`), `tpr` the true-positive rate of FPR@TPR and the threshold.
    With a `journal` each evaluated seed's rows are a row of it, as JSON text: a rerun of a killed job evaluates
    only the seeds left and returns the same frames."""
    acc_rows, open_rows = [], []
    for seed, state in states.items():
        if journal is None:
            seed_acc, seed_open = _seed_rows(method, seed, state, graph, cfg, tpr)
        else:
            if f"seed{seed}" not in journal:
                seed_acc, seed_open = _seed_rows(method, seed, state, graph, cfg, tpr)
                journal.append(
                    {"id": f"seed{seed}", "acc": json.dumps(seed_acc, default=_plain),
                     "open": json.dumps(seed_open, default=_plain)}
                )  # fmt: skip
            (row,) = journal.complete([f"seed{seed}"])
            seed_acc, seed_open = json.loads(row["acc"]), json.loads(row["open"])
        acc_rows += seed_acc
        open_rows += seed_open
    return pd.DataFrame(acc_rows), pd.DataFrame(open_rows)


def _seed_rows(
    method: str, seed: int, state: Mapping[str, torch.Tensor], graph: TaskGraph, cfg: Mapping[str, Any], tpr: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    acc_rows, open_rows = [], []
    for variant, outputs in stage_outputs(method, state, graph, cfg).items():
        for stage, out in enumerate(outputs):
            acc, opn = stage_metrics(graph, out, stage, tpr)
            tags = {"method": method, "variant": variant, "seed": seed}
            acc_rows += [tags | row for row in acc]
            if opn is not None:
                open_rows.append(tags | opn)
    return acc_rows, open_rows


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number JSON writes (int64 -> int, float64 -> float: the frame's dtypes stay)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def run_evaluation(
    method: str,
    tasks_file: str | Path,
    states_file: str | Path,
    cfg: Mapping[str, Any],
    tpr: float,
    acc_out: str | Path,
    open_out: str | Path,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate every seed's states and write the two frames; `journal`: a file in the job's checkpoint folder,
    where each evaluated seed is kept and from which a rerun of a killed job resumes (a scratch file when None)."""
    graph = load_task_graph(tasks_file)
    states, _ = load_states(states_file)
    with row_journal(journal) as done:
        acc, opn = evaluate_states(method, states, graph, cfg, tpr, done)
    write_frame(acc_out, acc, {"dataset": graph.name, "method": method})
    write_frame(open_out, opn, {"dataset": graph.name, "method": method})
    return {"variants": sorted(acc.variant.unique()), "seeds": sorted(int(s) for s in acc.seed.unique())}
