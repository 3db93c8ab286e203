"""Why SAFER's open-set AUROC margin over whole-task-graph TPP is small, and what limits `digits_af_safer` (issue 54).

Reads a finished run (`results/<scale>/safer/`: the task graph and the saved SAFER and TPP states with the settings
their train jobs used, from the states' provenance records) and re-evaluates it through the paper's own evaluation
code (`paperflow.safer.evaluation`), then prints, as markdown tables:

1. per stage with unknowns, the open-set AUROC of SAFER, TPP + MSP (task-graph and per-node routing) and TPP experts +
   energy, plus what-if scores built from SAFER's own trained experts: its free-energy term alone, its residual term
   alone, its energy with oracle routing of the knowns, its energy routed per task graph as TPP routes; and the
   ceiling of the margin, 1 − AUROC(TPP task graph): no score can beat TPP by more; and per task, the AUROC of each
   known task's nodes against the stage's unknowns and of the knowns against each unknown task's nodes;
2. where the AUROC deficit 1 − AUROC lies: the exact split of each method's deficit over (known task, unknown task)
   pairs (the pooled AUROC is the count-weighted mean of the pairwise AUROCs);
3. the energy routing's confusion after the last stage (true task × routed task, test nodes, summed over seeds) for
   SAFER, SAFER routed per task graph, TPP's per-node prototype routing, TPP experts + energy and TPP's task-graph
   routing, and task-ID accuracy per stage;
4. SAFER's average forgetting taken apart: the experts are frozen, so a task's accuracy can only change through
   routing; per task, the test nodes right at its own stage and wrong at the last (lost), the reverse (gained), and
   the later experts that took the lost ones; and AF's granularity (one lost node) against the −0.01 threshold.

Usage, from the repository root (one core is plenty; the smoke run takes seconds, the cpu run under a minute):

    OMP_NUM_THREADS=1 .venv/bin/python tools/diagnose/safer_margin.py [--scale smoke] [--dataset digits]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.safer.evaluation import (
    ExpertOutputs,
    StageOutput,
    energy_routing,
    expert_outputs,
    expert_stage_outputs,
    graph_groups,
    propagate_energy,
    routed,
)
from paperflow.safer.experts import free_energy
from paperflow.safer.graph import gcn_norm, to_torch
from paperflow.safer.metrics import auroc, average_forgetting
from paperflow.safer.tasks import TEST, TaskGraph, load_task_graph
from paperflow.safer.training import load_states, rebuild_backbone, rebuild_expert, sub_state

# ---------------------------------------------------------------------------------------------------------------------
# helpers (tested in tests/papers/test_safer_margin.py)


def pair_deficits(
    score: np.ndarray, task: np.ndarray, known: np.ndarray, unknown: np.ndarray
) -> dict[tuple[int, int], float]:
    """The deficit 1 − AUROC(score[known], score[unknown]) split exactly over (known task j, unknown task u) pairs.

    The pooled AUROC is Σ_{j,u} n_j n_u AUROC_{j,u} / (N_known N_unknown), so the pair (j, u) contributes
    n_j n_u (1 − AUROC_{j,u}) / (N_known N_unknown); the contributions sum to 1 − AUROC."""
    known_tasks, unknown_tasks = np.unique(task[known]), np.unique(task[unknown])
    total = known.sum() * unknown.sum()
    out = {}
    for j in known_tasks:
        kj = known & (task == j)
        for u in unknown_tasks:
            uu = unknown & (task == u)
            out[(int(j), int(u))] = float(kj.sum() * uu.sum() * (1.0 - auroc(score[kj], score[uu])) / total)
    return out


def per_task_auroc(
    score: np.ndarray, task: np.ndarray, known: np.ndarray, unknown: np.ndarray
) -> dict[tuple[str, int], float]:
    """AUROC of each known task's nodes against all unknowns, ("known", j), and of all knowns against each unknown
    task's nodes, ("unknown", u)."""
    out = {("known", int(j)): auroc(score[known & (task == j)], score[unknown]) for j in np.unique(task[known])}
    return out | {
        ("unknown", int(u)): auroc(score[known], score[unknown & (task == u)]) for u in np.unique(task[unknown])
    }


def group_argmin(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per node, the row of `values` (experts × nodes) whose mean over the node's group is least: a whole task graph
    routed at once, as TPP routes by its mean prototype; nodes of group −1 are routed on their own."""
    route = values.argmin(0)
    for g in np.unique(groups[groups >= 0]):
        members = groups == g
        route[members] = values[:, members].mean(1).argmin()
    return route


def confusion(truth: np.ndarray, routed: np.ndarray, n_true: int, n_routed: int) -> np.ndarray:
    """Counts[i, j] of nodes of true task i routed to task j."""
    out = np.zeros((n_true, n_routed), dtype=np.int64)
    np.add.at(out, (truth, routed), 1)
    return out


def add_counts(counts: Iterable[Mapping[int, int]]) -> dict[int, int]:
    """The key-wise sum of count dictionaries."""
    out: dict[int, int] = {}
    for one in counts:
        for k, c in one.items():
            out[k] = out.get(k, 0) + c
    return out


@dataclass(frozen=True)
class TaskForgetting:
    task: int
    n: int
    acc_own: float  # a_{j,j}
    acc_last: float  # a_{K-1,j}
    lost: int  # right at stage j, wrong at the last stage
    gained: int  # wrong at stage j, right at the last stage
    taken_by: dict[int, int]  # the last stage's routed task of the lost nodes: count
    lost_classes: dict[int, int]  # the true class of the lost nodes: count


def forgetting_breakdown(
    preds: Sequence[np.ndarray], routes: Sequence[np.ndarray], labels: np.ndarray, task: np.ndarray, test: np.ndarray
) -> list[TaskForgetting]:
    """Per task j < K−1 (K = len(preds) stages), the change of its test accuracy between its own stage and the last,
    node by node: a_{K-1,j} − a_{j,j} = (gained − lost) / n_j, the AF term of task j."""
    last = len(preds) - 1
    rows = []
    for j in range(last):
        nodes = test & (task == j)
        right_own = preds[j][nodes] == labels[nodes]
        right_last = preds[last][nodes] == labels[nodes]
        lost = right_own & ~right_last
        taken = routes[last][nodes][lost]
        rows.append(
            TaskForgetting(
                task=j,
                n=int(nodes.sum()),
                acc_own=float(right_own.mean()),
                acc_last=float(right_last.mean()),
                lost=int(lost.sum()),
                gained=int((~right_own & right_last).sum()),
                taken_by={int(t): int((taken == t).sum()) for t in np.unique(taken)},
                lost_classes={int(c): int((labels[nodes][lost] == c).sum()) for c in np.unique(labels[nodes][lost])},
            )
        )
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# loading a run


def load_method(root: Path, dataset: str, method: str) -> dict[int, tuple[dict[str, torch.Tensor], dict[str, Any]]]:
    """{seed: (state, the method's settings as its train job recorded them)} over every seed group of the run."""
    out = {}
    files = sorted((root / "runs" / dataset / method).glob("*/states.safetensors"))
    if not files:
        raise SystemExit(f"no {method} states under {root / 'runs' / dataset / method}; run the pipeline first")
    for path in files:
        cfg = json.loads(Path(f"{path}.prov.json").read_text())["params"]["method"]
        states, _ = load_states(path)
        out |= {seed: (state, cfg) for seed, state in states.items()}
    return out


@torch.no_grad()
def energy_terms(
    state: Mapping[str, torch.Tensor], graph: TaskGraph, a_hat: torch.Tensor, cfg: Mapping[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """SAFER's energy E_t = free energy + β ρ_t/ρ̄_t taken apart: (free-energy term, scaled residual), experts × nodes,
    each propagated as the evaluation propagates E (a no-op at the default 0 steps)."""
    backbone = rebuild_backbone(sub_state(state, "backbone"), cfg["k"])
    ecfg = cfg["expert"]
    x = torch.as_tensor(graph.features)
    fe, rho = [], []
    for t in range(graph.learned):
        expert = rebuild_expert(sub_state(state, f"expert{t}"), ecfg)
        z = expert.embed(backbone, a_hat, x)
        fe.append(free_energy(expert.logits(z), expert.temperature))
        rho.append(expert.scaled_residual(z))
    prop = ecfg["energy_propagation"]
    return tuple(propagate_energy(torch.stack(v), a_hat, prop["steps"], prop["alpha"]) for v in (fe, rho))


# ---------------------------------------------------------------------------------------------------------------------
# the measurement


def stage_masks(graph: TaskGraph, stage: int) -> tuple[np.ndarray, np.ndarray]:
    test = graph.split == TEST
    return test & (graph.task >= 0) & (graph.task <= stage), test & (graph.task > stage)


def what_if_scores(
    graph: TaskGraph, safer: ExpertOutputs, fe: torch.Tensor, rho: torch.Tensor, beta: float, stage: int
) -> dict[str, np.ndarray]:
    """Scores (higher = more known) at `stage` built from SAFER's own trained experts."""
    seen = slice(0, stage + 1)
    energy = safer.energy[seen].numpy()
    known, _ = stage_masks(graph, stage)
    oracle = -energy.min(0)
    rows = np.flatnonzero(known)
    oracle[rows] = -energy[graph.task[rows], rows]  # knowns scored by their own task's expert
    return {
        "safer free energy only": -fe[seen].min(0).values.numpy(),
        "safer residual only": -(beta * rho[seen]).min(0).values.numpy() if beta else np.zeros(energy.shape[1]),
        "safer oracle routing (knowns)": oracle,
    }


GRAPH_ROUTED = "safer task-graph routing"
PER_TASK = ("safer", "safer residual only", "tpp_graph_msp", "tpp_msp", "tpp_energy")


def graph_routed_safer(graph: TaskGraph, safer: ExpertOutputs, stage: int) -> StageOutput:
    """SAFER's experts and energy, but each task graph routed at once (argmin of its mean energy), as TPP routes."""
    energy = safer.energy[: stage + 1].numpy()
    route = group_argmin(energy, graph_groups(graph))
    return routed(graph, safer, route, -energy[route, np.arange(energy.shape[1])])


def fmt(v: float, digits: int = 4) -> str:
    return f"{v:.{digits}f}" if np.isfinite(v) else "–"


def table(frame: pd.DataFrame, digits: int = 4) -> str:
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join([frame.index.name or "", *cols]) + " |", "|" + "---|" * (len(cols) + 1)]
    for idx, row in frame.iterrows():
        cells = [fmt(v, digits) if isinstance(v, float) else str(v) for v in row.to_numpy()]
        lines.append("| " + " | ".join([str(idx), *cells]) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="smoke")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--results", default="results", help="the output root (results/<scale>/safer below it)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(args.results) / args.scale / "safer"
    graph = load_task_graph(root / "tasks" / f"{args.dataset}.npz")
    a_sp = gcn_norm(graph.adjacency)
    a_hat = to_torch(a_sp)
    safer_runs, tpp_runs = load_method(root, args.dataset, "safer"), load_method(root, args.dataset, "tpp")
    seeds = sorted(set(safer_runs) & set(tpp_runs))
    test = graph.split == TEST
    n_tasks = int(graph.task.max()) + 1
    print(f"# SAFER vs TPP on {args.dataset}, {args.scale} scale: seeds {seeds}, {graph.learned} learned tasks")
    print(
        f"\ntest nodes per task: {[int((test & (graph.task == t)).sum()) for t in range(n_tasks)]}; "
        f"task classes: {graph.task_classes.tolist()}"
    )

    auroc_rows, task_rows, deficit_rows, conf, task_id_rows, af_rows, forget, gaps = [], [], [], {}, [], [], [], []
    for seed in seeds:
        s_state, s_cfg = safer_runs[seed]
        t_state, t_cfg = tpp_runs[seed]
        variants = expert_stage_outputs("safer", s_state, graph, s_cfg) | expert_stage_outputs(
            "tpp", t_state, graph, t_cfg
        )
        safer_out = expert_outputs(s_state, graph, a_hat, s_cfg, "safer")
        variants[GRAPH_ROUTED] = [graph_routed_safer(graph, safer_out, s) for s in range(graph.learned)]
        fe, rho = energy_terms(s_state, graph, a_hat, s_cfg)
        beta = float(s_cfg["expert"]["beta"])
        if not torch.allclose(fe + beta * rho, safer_out.energy, atol=1e-4):
            raise SystemExit(f"seed {seed}: free energy + β·residual does not add up to SAFER's energy")
        for stage in range(graph.learned):
            known, unknown = stage_masks(graph, stage)
            if not unknown.any():
                continue
            scores = {v: outs[stage].score for v, outs in variants.items()}
            scores |= what_if_scores(graph, safer_out, fe, rho, beta, stage)
            for name, score in scores.items():
                auroc_rows.append(
                    {"seed": seed, "stage": stage, "score": name, "auroc": auroc(score[known], score[unknown])}
                )
            for name in PER_TASK:
                for (side, t), v in per_task_auroc(scores[name], graph.task, known, unknown).items():
                    task_rows.append({"seed": seed, "stage": stage, "score": name, "side": side, "task": t, "auroc": v})
            for name in ("safer", "tpp_graph_msp"):
                for (j, u), d in pair_deficits(scores[name], graph.task, known, unknown).items():
                    deficit_rows.append(
                        {"seed": seed, "stage": stage, "score": name, "known": j, "unknown": u, "deficit": d}
                    )
        last = graph.learned - 1
        for name in ("safer", GRAPH_ROUTED, "tpp_msp", "tpp_energy", "tpp_graph_msp"):
            outs = variants[name]
            nodes = test & (graph.task >= 0) & (graph.task < graph.learned)
            conf[name] = conf.get(name, 0) + confusion(
                graph.task[nodes], outs[last].route[nodes], graph.learned, graph.learned
            )
            for stage, out in enumerate(outs):
                seen = test & (graph.task >= 0) & (graph.task <= stage)
                task_id_rows.append(
                    {
                        "seed": seed,
                        "stage": stage,
                        "score": name,
                        "task_id_acc": float(np.mean(out.route[seen] == graph.task[seen])),
                    }
                )
            acc = np.full((graph.learned, graph.learned), np.nan)
            for stage, out in enumerate(outs):
                for j in range(stage + 1):
                    nj = test & (graph.task == j)
                    acc[stage, j] = np.mean(out.pred[nj] == graph.labels[nj])
            af_rows.append({"seed": seed, "score": name, "af": average_forgetting(acc)})
        safer_stage: list[StageOutput] = variants["safer"]
        for row in forgetting_breakdown(
            [o.pred for o in safer_stage], [o.route for o in safer_stage], graph.labels, graph.task, test
        ):
            forget.append({"seed": seed, **row.__dict__})
        # the lost nodes' energy gap at the last stage: E of their own expert minus E of the expert that took them
        route = energy_routing(graph, safer_out, last).route
        right_own = np.zeros(len(route), dtype=bool)
        for j in range(last):
            nj = test & (graph.task == j)
            right_own[nj] = safer_stage[j].pred[nj] == graph.labels[nj]
        lost = test & (graph.task >= 0) & (graph.task < last) & right_own & (safer_stage[last].pred != graph.labels)
        rows = np.flatnonzero(lost)
        e = safer_out.energy.numpy()
        gaps += list(e[graph.task[rows], rows] - e[route[rows], rows])

    aur = pd.DataFrame(auroc_rows)
    per_stage = aur.groupby(["score", "stage"]).auroc.mean().unstack()
    per_stage["mean"] = aur.groupby(["score", "seed"]).auroc.mean().groupby("score").mean()
    per_seed = aur.groupby(["score", "seed"]).auroc.mean().unstack()
    per_stage.index.name = "score (AUROC, mean over seeds)"
    print("\n## 1. Open-set AUROC per stage (mean over seeds) and the margin's ceiling\n")
    print(table(per_stage))
    tpp_g = per_seed.loc["tpp_graph_msp"]
    margin = per_seed.loc["safer"] - tpp_g
    ceiling = 1.0 - tpp_g
    bound = pd.DataFrame(
        {
            "SAFER − TPP(graph)": margin,
            "ceiling 1 − AUROC(TPP graph)": ceiling,
            "best score of SAFER's experts − TPP(graph)": per_seed.drop(
                index=[i for i in per_seed.index if i.startswith("tpp")]
            ).max(0)
            - tpp_g,
        }
    ).T
    bound["mean"] = bound.mean(1)
    bound.index.name = "per seed"
    print("\nThe margin over TPP (task graph) per seed, and the most any score could have (AUROC ≤ 1):\n")
    print(table(bound))
    sd = margin.std(ddof=1) if len(margin) > 1 else np.nan
    print(
        f"\nmargin: mean {margin.mean():.4f}, sd {fmt(sd)} over {len(margin)} seeds; ceiling: mean "
        f"{ceiling.mean():.4f}, max {ceiling.max():.4f}; the claim needs ≥ 0.05: the ceiling is "
        f"{'above' if ceiling.mean() >= 0.05 else 'below'} it."
    )

    pt = pd.DataFrame(task_rows)
    pt["column"] = pt.side + " " + pt.task.astype(str)
    ptab = (pt.groupby(["score", "column", "seed"]).auroc.mean().groupby(["score", "column"]).mean()).unstack()
    ptab = ptab.loc[list(PER_TASK), sorted(ptab.columns, key=lambda c: (c.split()[0], int(c.split()[1])))]
    ptab.index.name = "per-task AUROC (stages where defined, then seeds)"
    print(
        "\nPer task: `known j` = task j's known test nodes against every unknown of the stage; `unknown u` = every "
        "known against task u's nodes (mean over the stages where the task is known, resp. unknown, then seeds):\n"
    )
    print(table(ptab))

    dfc = pd.DataFrame(deficit_rows)
    n_stages = dfc.stage.nunique()
    print(
        "\n## 2. Where the AUROC deficit lies: 1 − AUROC split over (known task, unknown task), summed over the\n"
        "stages with unknowns and divided by their number (so each table sums to 1 − mean AUROC), mean over seeds\n"
    )
    for name in ("safer", "tpp_graph_msp"):
        sub = dfc[dfc.score == name]
        mat = sub.groupby(["known", "unknown"]).deficit.sum().unstack() / (n_stages * sub.seed.nunique())
        mat.index.name = f"{name}: known \\ unknown"
        mat["row sum"] = mat.sum(1)
        print(table(mat.fillna(np.nan), 4))
        print(f"\n{name}: total deficit {np.nansum(mat['row sum']):.4f}\n")

    print("## 3. Routing after the last stage: true task (rows) × routed task (columns), test nodes, all seeds\n")
    for name, mat in conf.items():
        frame = pd.DataFrame(mat, index=range(graph.learned), columns=[f"→{t}" for t in range(graph.learned)])
        frame.index.name = f"{name} (right: {np.trace(mat)}/{mat.sum()})"
        print(table(frame, 0) + "\n")
    tid = pd.DataFrame(task_id_rows).groupby(["score", "stage"]).task_id_acc.mean().unstack()
    tid.index.name = "task-ID accuracy by stage (mean over seeds)"
    print(table(tid) + "\n")

    print("## 4. SAFER's average forgetting, node by node\n")
    afs = pd.DataFrame(af_rows).groupby(["score", "seed"]).af.mean().unstack()
    afs["mean"] = afs.mean(1)
    afs.index.name = "AF per seed"
    print(table(afs) + "\n")
    fg = pd.DataFrame(forget)
    fgt = fg.groupby("task").agg(
        n=("n", "first"),
        acc_own=("acc_own", "mean"),
        acc_last=("acc_last", "mean"),
        lost=("lost", "sum"),
        gained=("gained", "sum"),
    )
    for col, title in (("taken_by", "lost nodes taken by (task: count)"), ("lost_classes", "lost nodes' class: count")):
        fgt[title] = [
            ", ".join(f"{k}: {c}" for k, c in sorted(add_counts(fg[fg.task == j][col]).items())) or "–"
            for j in fgt.index
        ]
    fgt.index.name = "task j (sums over seeds)"
    print(table(fgt) + "\n")
    net = (fg.groupby("seed").lost.sum() - fg.groupby("seed").gained.sum()).astype(int)
    k_minus_1 = graph.learned - 1
    n_mean = fgt.n.mean()
    print(
        f"net lost nodes per seed: {', '.join(f'{k}: {v}' for k, v in net.items())}; one lost node of a task of n = {n_mean:.0f} "
        f"moves AF by {1 / (k_minus_1 * n_mean):.4f}, so AF ≥ −0.01 allows at most "
        f"{int(np.floor(0.01 * k_minus_1 * n_mean + 1e-9))} net lost nodes per seed "
        f"(of {int(fgt.n.sum())} test nodes of tasks 0..{k_minus_1 - 1})."
    )
    if gaps:
        g = np.asarray(gaps)
        print(
            f"energy gap of the lost nodes, E(own expert) − E(expert that took them), last stage: {len(g)} nodes, "
            f"median {np.median(g):.3f}, quartiles {np.quantile(g, 0.25):.3f}–{np.quantile(g, 0.75):.3f}, max {g.max():.3f}"
        )


if __name__ == "__main__":
    main()
