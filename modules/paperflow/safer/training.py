"""The train stage: one method through the task sequence, per seed, replay-free.

`safer` and `tpp` train one expert per task on top of the frozen backbone; `finetune` and `ewc`
train one class-incremental network. The state saved after the sequence (safetensors) holds only
what the method keeps between stages: backbone, prompts, heads, fingerprints/prototypes, or the
network after each stage (spec §10 check 4 audits it)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from paperflow.safer.backbone import SGC
from paperflow.safer.baselines import ClassIL, fisher_anchor, train_stage
from paperflow.safer.experts import Expert, Fingerprint, train_expert
from paperflow.safer.fitting import LOOP, Engine
from paperflow.safer.graph import gcn_norm, smooth, submatrix, to_torch
from paperflow.safer.settings import CLASS_IL_METHODS, EXPERT_METHODS, METHODS
from paperflow.safer.tasks import TRAIN, TaskGraph, load_task_graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskBlock:
    """One task graph: its Â block, features, training nodes (local ids) and their labels."""

    nodes: np.ndarray
    a_hat: torch.Tensor
    x: torch.Tensor
    train_idx: torch.Tensor
    labels: np.ndarray  # dataset class ids of train_idx


def positions(classes: np.ndarray, labels: np.ndarray) -> torch.Tensor:
    """The index of each label in `classes` (a head's column order)."""
    lookup = {int(c): i for i, c in enumerate(classes)}
    return torch.as_tensor([lookup[int(c)] for c in labels], dtype=torch.long)


def task_block(graph: TaskGraph, a_hat: Any, t: int) -> TaskBlock:
    nodes = graph.nodes(t)
    train = np.flatnonzero(graph.split[nodes] == TRAIN)
    return TaskBlock(
        nodes=nodes,
        a_hat=to_torch(submatrix(a_hat, nodes)),
        x=torch.as_tensor(graph.features[nodes]),
        train_idx=torch.as_tensor(train),
        labels=graph.labels[nodes][train],
    )


def train_experts(
    method: str,
    graph: TaskGraph,
    backbone: SGC,
    cfg: Mapping[str, Any],
    seed: int,
    progress: bool = False,
    engine: Engine = LOOP,
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Experts 0..K-1 (and, for TPP, the task prototypes: the mean of Â^k X over each task's training nodes)."""
    a_hat = gcn_norm(graph.adjacency)
    ecfg = cfg["expert"]
    smoothed = smooth(a_hat, graph.features, cfg["prototype_k"]) if method == "tpp" else None
    state = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    history = []
    for t in tqdm(range(graph.learned), desc=f"{method} seed {seed}", disable=not progress):
        block = task_block(graph, a_hat, t)
        local = positions(graph.task_classes[t], block.labels)
        expert, losses = train_expert(
            backbone,
            block.a_hat,
            block.x,
            block.train_idx,
            local,
            len(graph.task_classes[t]),
            ecfg,
            seed * 1000 + t,
            progress,
            engine,
            f"{method}_seed{seed}_task{t}",
        )
        state |= {f"expert{t}.{k}": v for k, v in expert.state_dict().items()}
        if smoothed is not None:
            state[f"prototype{t}"] = torch.as_tensor(
                smoothed[block.nodes[block.train_idx.numpy()]].mean(0), dtype=torch.float32
            )
        history += [{"seed": seed, "stage": t, "epoch": e, "loss": l} for e, l in enumerate(losses)]
        log.info("%s seed %d task %d: rank %d, final loss %.4f", method, seed, t, expert.fingerprint.rank, losses[-1])
    return state, history


def train_class_il(
    method: str,
    graph: TaskGraph,
    backbone: SGC,
    cfg: Mapping[str, Any],
    seed: int,
    progress: bool = False,
    engine: Engine = LOOP,
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """The network after each stage, trained on each task's graph alone (EWC: with the penalty)."""
    a_hat = gcn_norm(graph.adjacency)
    order = graph.seen_classes(graph.learned - 1)
    torch.manual_seed(seed)
    model = ClassIL(backbone, len(order))
    anchors: list | None = [] if method == "ewc" else None
    state, history = {}, []
    for t in tqdm(range(graph.learned), desc=f"{method} seed {seed}", disable=not progress):
        block = task_block(graph, a_hat, t)
        y = positions(order, block.labels)
        seen = (t + 1) * graph.task_classes.shape[1]
        losses = train_stage(
            model,
            block.a_hat,
            block.x,
            block.train_idx,
            y,
            seen,
            cfg["class_il"],
            anchors,
            progress,
            engine,
            f"{method}_seed{seed}_stage{t}",
        )
        if anchors is not None:
            anchors.append(fisher_anchor(model, block.a_hat, block.x, block.train_idx, y, seen))
        state |= {f"stage{t}.{k}": v.detach().clone() for k, v in model.state_dict().items()}
        history += [{"seed": seed, "stage": t, "epoch": e, "loss": l} for e, l in enumerate(losses)]
    return state, history


def train_method(
    method: str,
    graph: TaskGraph,
    backbone: SGC,
    cfg: Mapping[str, Any],
    seed: int,
    progress: bool = False,
    engine: Engine = LOOP,
) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """`cfg` is the method's own config (`method_config`); `engine` the `train.engine` (paperflow.safer.fitting)."""
    if method in EXPERT_METHODS:
        return train_experts(method, graph, backbone, cfg, seed, progress, engine)
    if method in CLASS_IL_METHODS:
        return train_class_il(method, graph, backbone, cfg, seed, progress, engine)
    raise ValueError(f"method {method!r} is not known; known: {', '.join(METHODS)}")


def save_states(path: str | Path, states: Mapping[int, Mapping[str, torch.Tensor]], meta: Mapping[str, Any]) -> None:
    """Every seed's state in one safetensors file (keys `seed<s>.<name>`), the settings as metadata."""
    flat = {f"seed{s}.{k}": v.contiguous() for s, state in states.items() for k, v in state.items()}
    save_file(flat, str(path), metadata={"paperflow": json.dumps(meta)})


def load_states(path: str | Path) -> tuple[dict[int, dict[str, torch.Tensor]], dict[str, Any]]:
    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["paperflow"])
    states: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in load_file(str(path)).items():
        seed, name = key.split(".", 1)
        states.setdefault(int(seed.removeprefix("seed")), {})[name] = value
    return states, meta


def sub_state(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) + 1 :]: v for k, v in state.items() if k.startswith(prefix + ".")}


def rebuild_backbone(state: Mapping[str, torch.Tensor], k: int) -> SGC:
    weight = state["lin.weight"]
    model = SGC(weight.shape[1], weight.shape[0], k)
    model.load_state_dict(dict(state))
    return model.requires_grad_(False).eval()


def rebuild_expert(state: Mapping[str, torch.Tensor], cfg: Mapping[str, Any]) -> Expert:
    fp = Fingerprint(state["fp_mean"], state["fp_basis"], state["fp_var"])
    expert = Expert(state["prompt.basis"].shape[1], fp, state["head.weight"].shape[0], cfg, float(state["rho_scale"]))
    expert.load_state_dict(dict(state))
    return expert.requires_grad_(False).eval()


def rebuild_class_il(state: Mapping[str, torch.Tensor], k: int) -> ClassIL:
    backbone = rebuild_backbone(sub_state(state, "backbone"), k)
    model = ClassIL(backbone, state["head.weight"].shape[0])
    model.load_state_dict(dict(state))
    return model.requires_grad_(False).eval()


def run_training(
    method: str,
    tasks_file: str | Path,
    backbones_file: str | Path,
    cfg: Mapping[str, Any],
    seeds: list[int],
    out: str | Path,
    history_out: str | Path,
    progress: bool = False,
    engine: Engine = LOOP,
) -> dict[str, Any]:
    """Train `method` for each seed on the task sequence; write the states and the loss history. `engine`: the
    `train.engine` (`loop`, or `lightning` with its loggers' run_dir; paperflow.safer.fitting)."""
    graph = load_task_graph(tasks_file)
    backbones, _ = load_states(backbones_file)
    states, history = {}, []
    for seed in seeds:
        states[seed], rows = train_method(
            method, graph, rebuild_backbone(backbones[seed], cfg["k"]), cfg, seed, progress, engine
        )
        history += rows
    save_states(out, states, {"method": method, "learned": graph.learned})
    pd.DataFrame(history).to_csv(history_out, index=False)
    return {
        "engine": engine.name,
        "tasks_learned": graph.learned,
        "state_numel": {s: int(sum(v.numel() for v in st.values())) for s, st in states.items()},
    }
