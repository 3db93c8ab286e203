"""Side by side: our DecFus and DFLAvg (paperflow.decfus) and the official code
(github.com/Ublgod/DecFus-ICML2026, `Algorithm/Training_DecFus.py` and `Algorithm/Training_DFLAvg.py`, run
unmodified from a checkout) on the same inputs: the smoke run's digits train/test split and client
partitions (`results/smoke/decfus/{data,splits}`), the same MLP with the same initial weights (built by
`paperflow.decfus.nets` after the official `set_random_seed(seed)`, wrapped to return the `{'output': ...}` dict
the official code reads), the smoke settings (rounds, local epochs, batch, lr, momentum, test every round) and
every DecFus constant of `config/decfus.yaml`. Nothing of the official code is copied here: it is imported from
the checkout given with --official; its `swanlab` logger (remote) is replaced by a recorder of what it logs, its
`utils.utils.save_result` (text files under ./output) by a no-op and `optimizer.Adabelief` by a stub (imported
by `models/Update.py` but absent from the repository; SGD does not use it). Its `np.percentile` calls are
recorded (the module's `np` is a pass-through to numpy that keeps each call's values and cutoff) to read which
tensors each client averaged in every round.

Where the codes cannot share a random stream they differ: the official batch order comes from torch's global
generator (DataLoader shuffle) and its exchange draws from Python's `random`; ours from numpy generators
seeded by the run seed. So a full run is compared by its outcomes (accuracy, detector, θ, averaged fraction),
and these checks isolate one part each:
- `fusion`: one fusion step of both codes on the same snapshot of ten client models (our run's final states of
  that seed) with every θ_i = 0.75, 0.5, 0.25: the sets of averaged tensors must be equal and the averaged
  tensors equal to float tolerance (the official local training is replaced by handing it the snapshot);
- `detector`: the official `VarianceStabilityDetector` fed our run's V_i sequence of every client: the step at
  which it fires must equal ours;
- `late`: the late-firing question of issue 19, the partition of a seed held fixed and the run seed varied
  (`--late-partition`, `--late-seeds`) in both codes, to tell whether late firing belongs to the partition;
- `mechanism`: on that partition, both codes with the detector off and θ held at θ0 or θ1: the share of V_i
  windows that would pass the detector's test while most tensors are exchanged vs averaged.

Seconds are wall and CPU (user + sys of this process, `resource.getrusage`) per run, both codes in the same
process with one torch thread; the machine is shared, so read them as rough.

Usage (from the repository root, after a smoke run of decfus; the official commit's files are not in the
fetchable snapshot of the repository (its newest commit holds a README only), so they are read from the
stored index at commit f80037193d05992e0cc379303abf73d4dd4b32d8 and written verbatim under the checkout:
Algorithm/Training_DecFus.py, Algorithm/Training_DFLAvg.py, models/Update.py, models/test.py,
utils/set_seed.py, with that commit in a COMMIT file; a git clone checked out at that commit, with the COMMIT
file added, serves as well):

    .venv/bin/python tools/sidebyside/decfus/run.py --official /tmp/decfus_official \\
        --root results/smoke/decfus --out workflows/decfus/sidebyside.md [--readme workflows/decfus/README.md]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import resource
import sys
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import TensorDataset

from paperflow.core.config import load_paper_config
from paperflow.decfus.evaluation import curve_metrics
from paperflow.decfus.fusion import decfus_fusion, fused_keys
from paperflow.decfus.nets import build_network
from paperflow.decfus.prepare import read_partition
from paperflow.decfus.schedule import DetectorSteps, StabilityDetector
from paperflow.decfus.simulation import simulate
from paperflow.decfus.topology import paper_topology
from paperflow.decfus.training import load_split

sys.path.insert(0, str(Path(__file__).parents[1]))  # tools/sidebyside: the shared splice
from splice import splice  # noqa: E402

NB = paper_topology()
METHODS = {"decfus": "DecFus", "dflavg": "DFLAvg"}


class DictOutput(nn.Module):
    """Our network, answering `{'output': logits}` as the official networks do."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"output": self.net(x)}


class NumpyProbe(types.ModuleType):
    """numpy for the official module, recording each `percentile` call (the client's s_min values and cutoff)."""

    def __init__(self) -> None:
        super().__init__("numpy_probe")
        self.calls: list[tuple[np.ndarray, float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    def percentile(self, values, q):
        cut = np.percentile(values, q)
        self.calls.append((np.asarray(values, dtype=float), float(cut)))
        return cut


class Official:
    """The checkout's DecFus and DFLAvg modules with their remote logger and file writers stubbed."""

    def __init__(self, path: Path) -> None:
        self.log: list[dict[str, Any]] = []
        swanlab = types.ModuleType("swanlab")
        swanlab.log = lambda d: self.log.append(dict(d))
        swanlab.init = lambda **kw: None
        utils_stub = types.ModuleType("utils.utils")
        utils_stub.save_result = lambda *a, **k: None
        adabelief = types.ModuleType("optimizer.Adabelief")
        adabelief.AdaBelief = None
        sys.modules.update(
            {
                "swanlab": swanlab,
                "utils.utils": utils_stub,
                "optimizer": types.ModuleType("optimizer"),
                "optimizer.Adabelief": adabelief,
            }
        )
        sys.path.insert(0, str(path))
        self.decfus = importlib.import_module("Algorithm.Training_DecFus")
        self.dflavg = importlib.import_module("Algorithm.Training_DFLAvg")
        self.seed = importlib.import_module("utils.set_seed").set_random_seed
        self.probe = NumpyProbe()
        self.decfus.np = self.probe
        self.commit = (path / "COMMIT").read_text().strip() if (path / "COMMIT").exists() else "unknown"


def official_args(cfg: Mapping[str, Any]) -> argparse.Namespace:
    """The official `args` (utils/options.py names) set to our config's values."""
    t, d = cfg["train"], cfg["decfus"]
    return argparse.Namespace(
        epochs=t["rounds"],
        num_users=cfg["clients"],
        local_ep=t["local_epochs"],
        local_bs=t["batch_size"],
        bs=128,
        optimizer="sgd",
        lr=t["lr"],
        momentum=t["momentum"],
        test_round=t["test_round"],
        gpu=-1,
        device=torch.device("cpu"),
        verbose=False,
        initial_threshold=d["theta0"],
        final_threshold=d["theta1"],
        sigmoid_steepness=d["steepness"],
        sigmoid_midpoint=d["midpoint"],
        variance_window_size=d["window"],
        variance_stability_threshold=d["stability_ratio"],
        variance_protection_ratio=d["protection"],
        variance_descent_ratio=d["kappa"],
        variance_reference_start_ratio=d["ref_start"],
        variance_reference_end_ratio=d["ref_end"],
        exchange_prob=d["p_exchange"],
    )


def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float, float]:
    """fn(*args), its wall seconds and CPU seconds (user + sys of this process)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    out = fn(*args)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return out, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def official_frames(
    off: Official, method: str, rounds: int, m: int, theta0: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Curves and per-client rows in our column names from what the official run logged."""
    curves = pd.DataFrame(
        {
            "round": [int(e["round"]) for e in off.log],
            "test_acc": [float(e["average_test_accuracy"]) / 100.0 for e in off.log],
            "test_loss": [float(e["average_test_loss"]) for e in off.log],
            "consensus": np.nan,
        }
    )
    if method != "decfus":
        return curves, pd.DataFrame(
            {"round": [], "client": [], "theta": [], "stable_round": [], "averaged_fraction": []}
        )
    calls = off.probe.calls
    if len(calls) != rounds * m:
        raise RuntimeError(f"expected {rounds * m} percentile calls, recorded {len(calls)}")
    rows = []
    for r in range(rounds):
        previous = off.log[r - 1] if r > 0 else {}
        for i in range(m):
            values, cut = calls[r * m + i]
            rows.append(
                {
                    "round": r,
                    "client": i,
                    "theta": previous.get(f"client_{i}_threshold", theta0),  # the θ used in round r
                    "averaged_fraction": float((values > cut).mean()),
                    "variance": float(off.log[r][f"client_{i}_neighbor_train_variance"]),
                    "stable_round": off.log[r].get(f"client_{i}_stable_round", np.nan),
                }
            )
    return curves, pd.DataFrame(rows)


class Inputs:
    """The smoke run's data, one partition's client index lists per seed, and the config."""

    def __init__(self, root: Path, dataset: str, cfg: Mapping[str, Any]) -> None:
        self.root, self.dataset, self.cfg = root, dataset, cfg
        self.x_train, self.y_train, meta = load_split(root / "data" / dataset / "train.parquet")
        self.x_test, self.y_test, _ = load_split(root / "data" / dataset / "test.parquet")
        self.classes = meta["classes"]

    def parts(self, partition: str, seed: int) -> list[np.ndarray]:
        return read_partition(self.root / "splits" / self.dataset / partition / f"seed{seed}.json")

    def network(self) -> nn.Module:
        return build_network(self.cfg["model"], self.x_train.shape[1:], self.classes)


def run_ours(inp: Inputs, method: str, parts: list[np.ndarray], seed: int, decfus: Mapping[str, Any] | None = None):
    """One run of ours; `decfus` overrides keys of the config's decfus block."""
    cfg = inp.cfg
    return simulate(
        method=method,
        x_train=inp.x_train,
        y_train=inp.y_train,
        x_test=inp.x_test,
        y_test=inp.y_test,
        parts=parts,
        neighbours=NB,
        classes=inp.classes,
        model=cfg["model"],
        train=cfg["train"] | {"device": "cpu"},
        decfus=cfg["decfus"] | (decfus or {}),
        seed=seed,
    )


def run_official(
    off: Official, inp: Inputs, method: str, parts: list[np.ndarray], seed: int, decfus: Mapping[str, Any] | None = None
) -> None:
    """One official run, as main_fed.py: seeds set, then the network built, then the algorithm."""
    off.log.clear()
    off.probe.calls.clear()
    args = official_args(inp.cfg | {"decfus": inp.cfg["decfus"] | (decfus or {})})
    off.seed(seed)
    net = DictOutput(inp.network())
    train = TensorDataset(torch.as_tensor(inp.x_train), torch.as_tensor(inp.y_train))
    test = TensorDataset(torch.as_tensor(inp.x_test), torch.as_tensor(inp.y_test))
    users = {i: p.tolist() for i, p in enumerate(parts)}
    algorithm = off.decfus.DecFus if method == "decfus" else off.dflavg.DFLAvg
    with contextlib.redirect_stdout(io.StringIO()):
        algorithm(args, net, train, test, users)


def outcome(curves: pd.DataFrame, clients: pd.DataFrame, tail: int) -> dict[str, float]:
    out = (
        curve_metrics(curves, clients, tail)
        if len(clients)
        else {"final_acc": float(curves.tail(tail).test_acc.mean())}
    )
    if len(clients):
        stable = clients.groupby("client").stable_round.last()
        out |= {"stable_first": float(stable.min()), "stable_last": float(stable.max())}
    return out


def full_runs(off: Official, inp: Inputs, partitions: list[str], seeds: list[int], methods: list[str]) -> pd.DataFrame:
    tail, rounds, theta0 = inp.cfg["evaluate"]["tail"], inp.cfg["train"]["rounds"], inp.cfg["decfus"]["theta0"]
    rows = []
    for part in partitions:
        for seed in seeds:
            parts = inp.parts(part, seed)
            for method in methods:
                ours, wall, cpu = timed(run_ours, inp, method, parts, seed)
                rows.append(
                    {"partition": part, "seed": seed, "method": method, "impl": "ours", "wall_s": wall, "cpu_s": cpu}
                    | outcome(ours.curves, ours.clients, tail)
                )
                print(rows[-1], flush=True)
                _, wall, cpu = timed(run_official, off, inp, method, parts, seed)
                curves, clients = official_frames(off, method, rounds, len(parts), theta0)
                rows.append(
                    {
                        "partition": part,
                        "seed": seed,
                        "method": method,
                        "impl": "official",
                        "wall_s": wall,
                        "cpu_s": cpu,
                    }
                    | outcome(curves, clients, tail)
                )
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def late_runs(off: Official, inp: Inputs, partition: str, part_seed: int, run_seeds: list[int]) -> pd.DataFrame:
    """DecFus on one fixed partition (that of `part_seed`) with several run seeds, both codes: per client,
    the round at which its detector fired."""
    rounds, theta0 = inp.cfg["train"]["rounds"], inp.cfg["decfus"]["theta0"]
    parts = inp.parts(partition, part_seed)
    rows = []
    for seed in run_seeds:
        ours = run_ours(inp, "decfus", parts, seed).clients
        run_official(off, inp, "decfus", parts, seed)
        _, theirs = official_frames(off, "decfus", rounds, len(parts), theta0)
        for impl, clients in (("ours", ours), ("official", theirs)):
            stable = clients.groupby("client").stable_round.last()
            last = clients[clients["round"] == rounds - 1]
            rows.append(
                {"impl": impl, "run_seed": seed, "theta_final_max": float(last.theta.max())}
                | {f"c{i}": stable.get(i, np.nan) for i in range(len(parts))}
            )
        print(rows[-2:], flush=True)
    return pd.DataFrame(rows)


def window_pass_share(clients: pd.DataFrame, cfg: Mapping[str, Any]) -> float:
    """Share of (client, evaluation step past protection) whose last `window` V_i values pass the
    detector's test, std / reference mean < stability ratio (as the detector computes it)."""
    t, d = cfg["train"], cfg["decfus"]
    steps = DetectorSteps.from_ratios(t["rounds"], t["test_round"], d["protection"], d["ref_start"], d["ref_end"])
    v = clients.dropna(subset=["variance"]).pivot(index="round", columns="client", values="variance")
    v.index = v.index // t["test_round"]
    ref = v.loc[steps.ref_start : steps.ref_end].mean().clip(lower=1e-6)
    rel = (v.rolling(d["window"]).std(ddof=0) / ref).loc[max(steps.protection, steps.ref_end + 1) :]
    return float((rel < d["stability_ratio"]).to_numpy().mean())


def mechanism_runs(off: Official, inp: Inputs, partition: str, seed: int) -> pd.DataFrame:
    """Both codes on one partition with the detector off (stability ratio 0) and θ held at θ0 or at θ1:
    how often V_i's window would pass the detector's test while most tensors are exchanged vs averaged."""
    rounds, d = inp.cfg["train"]["rounds"], inp.cfg["decfus"]
    parts = inp.parts(partition, seed)
    rows = []
    for theta in (d["theta0"], d["theta1"]):
        held = {"stability_ratio": 0.0, "theta0": theta}
        ours = run_ours(inp, "decfus", parts, seed, held).clients
        run_official(off, inp, "decfus", parts, seed, held)
        _, theirs = official_frames(off, "decfus", rounds, len(parts), theta)
        for impl, clients in (("ours", ours), ("official", theirs)):
            rows.append({"impl": impl, "theta": theta, "pass_share": window_pass_share(clients, inp.cfg)})
        print(rows[-2:], flush=True)
    return pd.DataFrame(rows)


def detector_replay(off: Official, inp: Inputs, clients: pd.DataFrame) -> tuple[int, int]:
    """Feed each client's V_i sequence of our run to the official detector and to ours; (agreeing, total)."""
    t, d = inp.cfg["train"], inp.cfg["decfus"]
    rounds, tr = t["rounds"], t["test_round"]
    agree = total = 0
    for _, group in clients.dropna(subset=["variance"]).groupby("client"):
        theirs = off.decfus.VarianceStabilityDetector(
            window_size=d["window"],
            stability_threshold=d["stability_ratio"],
            protection_rounds=int(rounds * d["protection"] / tr),
            ref_start_round=int(rounds * d["ref_start"] / tr),
            ref_end_round=int(rounds * d["ref_end"] / tr),
        )
        steps = DetectorSteps.from_ratios(rounds, tr, d["protection"], d["ref_start"], d["ref_end"])
        mine = StabilityDetector(d["window"], d["stability_ratio"], steps)
        for r, v in zip(group["round"], group.variance):
            theirs.update(v, int(r) // tr)
            mine.update(v, int(r) // tr)
        agree += theirs.stable_round == mine.stable_step
        total += 1
    return agree, total


def fusion_check(off: Official, inp: Inputs, states: Mapping[str, torch.Tensor], parts, theta: float) -> dict:
    """One fusion of both codes on the same snapshot with every θ_i = theta."""
    m = len(parts)
    keys = list(states)
    snapshot = [{f"net.{k}": states[k][i].clone() for k in keys} for i in range(m)]
    fused: list[dict[str, torch.Tensor]] = []
    dec = off.decfus
    original_train, original_test = dec.DecFusClient.train, dec.test_with_loss

    handed: list[int] = []

    def train(client, net, current_lr):  # instead of local SGD: client i's model of the snapshot
        handed.append(1)
        return copy.deepcopy(snapshot[len(handed) - 1])

    def record(net, dataset, args):
        if isinstance(dataset, off.decfus.DatasetSplit):
            fused.append({k[len("net.") :]: v.detach().clone() for k, v in net.state_dict().items()})
        return original_test(net, dataset, args)

    off.log.clear()
    off.probe.calls.clear()
    args = official_args(inp.cfg)
    args.epochs, args.initial_threshold = 1, theta
    dec.DecFusClient.train, dec.test_with_loss = train, record
    try:
        off.seed(0)
        net = DictOutput(inp.network())
        data = TensorDataset(torch.as_tensor(inp.x_train), torch.as_tensor(inp.y_train))
        with contextlib.redirect_stdout(io.StringIO()):
            dec.DecFus(args, net, data, data, {i: p.tolist() for i, p in enumerate(parts)})
    finally:
        dec.DecFusClient.train, dec.test_with_loss = original_train, original_test
    theirs_mask = np.array([values > cut for values, cut in off.probe.calls])
    n = [len(p) for p in parts]
    ours = decfus_fusion(dict(states), NB, n, [theta] * m, inp.cfg["decfus"]["p_exchange"], np.random.default_rng(0))
    ours_fused = ours.apply(dict(states))
    diffs = [
        float((ours_fused[k][i].double() - fused[i][k].double()).abs().max())
        for i in range(m)
        for l, k in enumerate(fused_keys(states))
        if ours.averaged[i, l]
    ]
    return {
        "theta": theta,
        "same_averaged_sets": bool(np.array_equal(theirs_mask, ours.averaged)),
        "averaged_fraction": float(ours.averaged.mean()),
        "max_abs_diff_averaged": max(diffs) if diffs else 0.0,
    }


def exact_checks(off: Official, inp: Inputs, partitions: list[str], seeds: list[int]) -> pd.DataFrame:
    rows = []
    for part in partitions:
        for seed in seeds:
            parts = inp.parts(part, seed)
            run = run_ours(inp, "decfus", parts, seed)
            agree, total = detector_replay(off, inp, run.clients)
            for theta in (0.75, 0.5, 0.25):
                rows.append(
                    {"partition": part, "seed": seed, "detector_agree": f"{agree}/{total}"}
                    | fusion_check(off, inp, run.states, parts, theta)
                )
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def schedule_cells(r: pd.Series) -> list[str]:
    """θ max at the end, averaged fraction first → last round, first–last detector firing round."""
    return [
        f"{r.theta_final_max:.3f}",
        f"{r.averaged_first:.2f} → {r.averaged_last:.2f}",
        f"{r.stable_first:.0f}–{r.stable_last:.0f}",
    ]


def render(
    full: pd.DataFrame,
    exact: pd.DataFrame,
    late: pd.DataFrame | None,
    mechanism: pd.DataFrame | None,
    meta: Mapping[str, Any],
) -> str:
    cfg = meta["cfg"]
    t = cfg["train"]
    lines = [
        f"Official code: github.com/Ublgod/DecFus-ICML2026 at {meta['commit']} (`Algorithm/Training_DecFus.py`, "
        f"`Algorithm/Training_DFLAvg.py`, `models/Update.py`, `models/test.py`, `utils/set_seed.py`, unmodified); "
        f"torch {torch.__version__}, one CPU thread.",
        f"Inputs: the smoke run's `{meta['dataset']}` split and partitions, the same MLP ({cfg['model']['hidden']}, "
        f"init `{cfg['model']['init']}`) with the same initial weights per seed; R = {t['rounds']}, E = {t['local_epochs']}, "
        f"batch {t['batch_size']}, lr {t['lr']}, momentum {t['momentum']}, test every {t['test_round']} round(s); "
        "DecFus constants of config/decfus.yaml. Final accuracy = mean of the last "
        f"{cfg['evaluate']['tail']} evaluations; θ max = the largest client θ in the last round; averaged = client-mean "
        "fraction of averaged tensors in round 0 → last round; fired = rounds at which the first / last client's detector fired.",
        "",
        "| partition | seed | method | final acc ours | final acc official | θ max ours | θ max official "
        "| averaged ours | averaged official | fired ours | fired official | s ours (CPU) | s official (CPU) | speed ratio (CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    key = ["partition", "seed", "method"]
    pivot = full.set_index([*key, "impl"])
    for (part, seed, method), _ in full.groupby(key, sort=False):
        o, f = pivot.loc[(part, seed, method, "ours")], pivot.loc[(part, seed, method, "official")]

        cells = [schedule_cells(o), schedule_cells(f)] if method == "decfus" else [["–"] * 3] * 2
        paired = " | ".join(f"{a} | {b}" for a, b in zip(*cells))
        lines.append(
            f"| {part} | {seed} | {METHODS[method]} | {o.final_acc:.4f} | {f.final_acc:.4f} | {paired} "
            f"| {o.wall_s:.1f} ({o.cpu_s:.1f}) | {f.wall_s:.1f} ({f.cpu_s:.1f}) "
            f"| {f.wall_s / o.wall_s:.1f}× ({f.cpu_s / o.cpu_s:.1f}×) |"
        )
    lines += [
        "",
        "Mean ± std over seeds (final accuracy, and DecFus − DFLAvg per seed, the gated comparison):",
        "",
        "| partition | impl | DecFus | DFLAvg | DecFus − DFLAvg (per seed) | s per run (CPU) |",
        "|---|---|---|---|---|---|",
    ]
    for (part, impl), g in full.groupby(["partition", "impl"], sort=False):
        dec = g[g.method == "decfus"].set_index("seed").final_acc
        avg = g[g.method == "dflavg"].set_index("seed").final_acc
        diff = (dec - avg).dropna()
        lines.append(
            f"| {part} | {impl} | {dec.mean():.4f} ± {dec.std():.4f} | {avg.mean():.4f} ± {avg.std():.4f} "
            f"| {diff.mean():+.4f} ({', '.join(f'{s}: {v:+.4f}' for s, v in diff.items())}) "
            f"| {g.wall_s.mean():.1f} ({g.cpu_s.mean():.1f}) |"
        )
    lines += [
        "",
        "Exact checks on shared inputs (fusion: both codes fuse the same snapshot, our run's final client models, "
        "with every θ_i set; detector: the official detector fed our V_i sequences):",
        "",
        "| partition | seed | θ | same averaged sets | averaged fraction | max abs diff of averaged tensors | detector steps equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in exact.itertuples():
        lines.append(
            f"| {r.partition} | {r.seed} | {r.theta} | {'yes' if r.same_averaged_sets else 'NO'} | {r.averaged_fraction:.3f} "
            f"| {r.max_abs_diff_averaged:.1e} | {r.detector_agree} |"
        )
    if late is not None:
        clients = [c for c in late.columns if c.startswith("c")]
        lines += [
            "",
            f"Late firing: DecFus on the partition of `{meta['late'][0]}` seed {meta['late'][1]} held fixed, run seed "
            "varied (initial weights, batch order, exchange draws); round at which each client's detector fired "
            "(– = never):",
            "",
            f"| impl | run seed | {' | '.join(f'client {c[1:]}' for c in clients)} | θ max at the end |",
            f"|---|---|{'---|' * len(clients)}---|",
        ]
        for r in late.itertuples():
            fired = " | ".join("–" if np.isnan(getattr(r, c)) else f"{getattr(r, c):.0f}" for c in clients)
            lines.append(f"| {r.impl} | {r.run_seed} | {fired} | {r.theta_final_max:.3f} |")
    if mechanism is not None:
        lines += [
            "",
            f"Why late: on the same partition and run seed, detector off and θ held fixed, the share of (client, "
            f"step past round {int(cfg['decfus']['ref_end'] * t['rounds'])}) whose window of V_i would pass the "
            "detector's test (std / reference < stability ratio):",
            "",
            "| impl | θ held at | share of windows that pass |",
            "|---|---|---|",
        ]
        for r in mechanism.itertuples():
            lines.append(f"| {r.impl} | {r.theta} | {r.pass_share:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--official", type=Path, required=True, help="checkout of github.com/Ublgod/DecFus-ICML2026")
    parser.add_argument("--root", type=Path, default=Path("results/smoke/decfus"), help="a smoke results folder")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--partitions", nargs="+", default=None, help="default: the smoke run_partitions")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: the smoke seeds")
    parser.add_argument("--late-partition", nargs=2, metavar=("PARTITION", "SEED"), default=["dir05", "2"])
    parser.add_argument("--late-seeds", type=int, nargs="*", default=[2, 10, 11, 12, 13, 14])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme", type=Path, default=None, help="README to put the table in")
    parser.add_argument("--render-only", action="store_true", help="re-render --out from the CSVs beside it")
    parser.add_argument("--mechanism-only", action="store_true", help="run only the held-θ runs, reuse the other CSVs")
    args = parser.parse_args()
    cfg = load_paper_config("decfus", "smoke")
    partitions = args.partitions or list(cfg["run_partitions"])
    seeds = args.seeds or list(cfg["seeds"])
    torch.set_num_threads(1)
    off = Official(args.official)
    names = ("full", "exact", "late", "mechanism")
    csv = {name: args.out.with_name(f"{args.out.stem}_{name}.csv") for name in names}
    if args.render_only:
        full, exact = pd.read_csv(csv["full"]), pd.read_csv(csv["exact"])
        late, mechanism = (pd.read_csv(csv[n]) if csv[n].exists() else None for n in ("late", "mechanism"))
    elif args.mechanism_only:
        inp = Inputs(args.root, args.dataset, cfg)
        full, exact, late = pd.read_csv(csv["full"]), pd.read_csv(csv["exact"]), pd.read_csv(csv["late"])
        mechanism = mechanism_runs(off, inp, args.late_partition[0], int(args.late_partition[1]))
        mechanism.to_csv(csv["mechanism"], index=False)
    else:
        inp = Inputs(args.root, args.dataset, cfg)
        exact = exact_checks(off, inp, partitions, seeds)
        exact.to_csv(csv["exact"], index=False)
        full = full_runs(off, inp, partitions, seeds, list(METHODS))
        full.to_csv(csv["full"], index=False)
        late = mechanism = None
        if args.late_seeds:
            late = late_runs(off, inp, args.late_partition[0], int(args.late_partition[1]), args.late_seeds)
            late.to_csv(csv["late"], index=False)
            mechanism = mechanism_runs(off, inp, args.late_partition[0], int(args.late_partition[1]))
            mechanism.to_csv(csv["mechanism"], index=False)
    meta = {"cfg": cfg, "commit": off.commit, "dataset": args.dataset, "late": args.late_partition}
    args.out.write_text(render(full, exact, late, mechanism, meta))
    if args.readme is not None:
        splice(args.readme, "sidebyside", args.out.read_text())
    print(args.out.read_text())


if __name__ == "__main__":
    main()
