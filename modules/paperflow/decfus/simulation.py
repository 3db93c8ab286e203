"""One decentralised run (spec §2.2): R rounds of local SGD → evaluation (before fusion) → fusion →
DecFus's phase control. The whole simulation is one process: all clients are coupled every round."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from paperflow.core.config import reject_unknown
from paperflow.core.loop import LoopCheckpoint
from paperflow.core.resume import EVERY_S
from paperflow.decfus.clients import batch_plan, local_losses, local_round, make_clients, stack_states, test_metrics
from paperflow.decfus.fusion import States, consensus_distance, round_fusion
from paperflow.decfus.nets import build_network
from paperflow.decfus.schedule import DetectorSteps, StabilityDetector, client_threshold
from paperflow.decfus.topology import Neighbours, closed_neighbourhood, metropolis_mixing

if TYPE_CHECKING:  # Lightning is imported by the Fabric engine only (paperflow.decfus.lightning)
    from lightning_fabric import Fabric

log = logging.getLogger(__name__)

# the keys of the config blocks a run reads (config/schemas/decfus.schema.yaml)
MODEL_KEYS = ("arch", "hidden", "init")
TRAIN_KEYS = (
    "rounds",
    "local_epochs",
    "batch_size",
    "lr",
    "momentum",
    "test_round",
    "eval_batch_size",
    "seeds_per_job",
    "backend",
    "device",
    "engine",
)
DECFUS_KEYS = (
    "theta0",
    "theta1",
    "steepness",
    "midpoint",
    "kappa",
    "window",
    "stability_ratio",
    "protection",
    "ref_start",
    "ref_end",
    "p_exchange",
)


@dataclass
class RunResult:
    curves: pd.DataFrame  # per evaluated round: client-mean test accuracy/loss, consensus distance
    clients: pd.DataFrame  # per round and client: θ used, fraction of averaged tensors, V_i, stability
    states: States  # the clients' models after the last fusion


class RunState:
    """What a run carries from round to round, as an object `LoopCheckpoint` saves (tensors, numbers and lists, so
    the checkpoint loads with torch's weights_only): the clients' stacked states, their thresholds θ_i, the
    stability detectors, the batch-plan and fusion generators, and the curves and client rows so far. The lists and
    detectors are the loop's own objects, restored in place; `states` is rebound each round."""

    def __init__(
        self,
        states: States,
        thetas: list[float],
        detectors: list[StabilityDetector],
        plan_rng: np.random.Generator,
        fusion_rng: np.random.Generator,
        curves: list[dict[str, Any]],
        rows: list[dict[str, Any]],
    ) -> None:
        self.states, self.thetas, self.detectors = states, thetas, detectors
        self.plan_rng, self.fusion_rng, self.curves, self.rows = plan_rng, fusion_rng, curves, rows

    def state_dict(self) -> dict[str, Any]:
        return {
            "states": {k: v.detach().cpu() for k, v in self.states.items()},
            "thetas": list(self.thetas),
            "detectors": [
                {
                    "history": list(d.history),
                    "reference_values": list(d.reference_values),
                    "reference": d.reference,
                    "stable_step": d.stable_step,
                }
                for d in self.detectors
            ],
            "plan_rng": self.plan_rng.bit_generator.state,
            "fusion_rng": self.fusion_rng.bit_generator.state,
            "curves": list(self.curves),
            "rows": list(self.rows),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        device = next(iter(self.states.values())).device
        self.states = {k: v.to(device) for k, v in state["states"].items()}
        self.thetas[:] = state["thetas"]
        for detector, saved in zip(self.detectors, state["detectors"], strict=True):
            detector.history.clear()
            detector.history.extend(saved["history"])
            detector.reference_values[:] = saved["reference_values"]
            detector.reference, detector.stable_step = saved["reference"], saved["stable_step"]
        self.plan_rng.bit_generator.state = state["plan_rng"]
        self.fusion_rng.bit_generator.state = state["fusion_rng"]
        self.curves[:] = state["curves"]
        self.rows[:] = state["rows"]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_detectors(m: int, rounds: int, test_round: int, cfg: Mapping[str, Any]) -> list[StabilityDetector]:
    steps = DetectorSteps.from_ratios(rounds, test_round, cfg["protection"], cfg["ref_start"], cfg["ref_end"])
    return [StabilityDetector(cfg["window"], cfg["stability_ratio"], steps) for _ in range(m)]


def simulate(
    *,
    method: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    parts: Sequence[np.ndarray],
    neighbours: Neighbours,
    classes: int,
    model: Mapping[str, Any],
    train: Mapping[str, Any],
    decfus: Mapping[str, Any],
    seed: int,
    progress: bool = False,
    fabric: Fabric | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
) -> RunResult:
    """Run `method` for train["rounds"] rounds from one shared initialisation (seeded by `seed`);
    `model`, `train` and `decfus` are the config blocks of those names. With `fabric` (train.engine: lightning,
    paperflow.decfus.lightning) the same loop runs on the Fabric's device, its gradients come from fabric.backward
    and the evaluated rounds are logged to its loggers as seed<seed>/<column>. With `checkpoint_dir` (this run's
    folder under the job's checkpoint_dir()) the run's state (`RunState`) is saved there after a round every
    `checkpoint_every_s` at most and after the last, and a rerun continues from it (a finished run is loaded)."""
    reject_unknown(model, MODEL_KEYS, "decfus model")
    reject_unknown(train, TRAIN_KEYS, "decfus train")
    reject_unknown(decfus, DECFUS_KEYS, "decfus decfus")
    if (fabric is not None) != (train["engine"] == "lightning"):
        raise ValueError(f"train.engine = {train['engine']!r} but simulate got {'a' if fabric else 'no'} Fabric")
    if fabric is None:
        device, grad = pick_device(train["device"]), torch.autograd.grad
    else:
        from paperflow.decfus.lightning import fabric_grad

        device, grad = fabric.device, fabric_grad(fabric)
        fabric.seed_everything(seed, verbose=False)  # python, numpy, torch; the run's own streams are seeded below
    torch.manual_seed(seed)
    plan_rng, fusion_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    net = build_network(model, x_train.shape[1:], classes).to(device)
    clients = make_clients(net, train["backend"])
    m = len(parts)
    states = stack_states(net, m, device)
    xtr, ytr = torch.as_tensor(x_train, device=device), torch.as_tensor(y_train, device=device)
    xte, yte = torch.as_tensor(x_test, device=device), torch.as_tensor(y_test, device=device)
    n = [len(p) for p in parts]
    rounds, test_round = train["rounds"], train["test_round"]
    thetas = [decfus["theta0"]] * m
    detectors = make_detectors(m, rounds, test_round, decfus)
    gossip = metropolis_mixing(neighbours) if method == "dpsgd" else None
    curves, rows = [], []
    run = RunState(states, thetas, detectors, plan_rng, fusion_rng, curves, rows)
    start, checkpoint = 0, None
    if checkpoint_dir is not None:
        checkpoint = LoopCheckpoint(checkpoint_dir, {"run": run}, checkpoint_every_s)
        start, _ = checkpoint.restore()
        states = run.states
        if fabric is not None:  # a fresh log has every evaluated round
            for row in curves:
                fabric.log_dict({f"seed{seed}/{k}": v for k, v in row.items() if k != "round"}, step=int(row["round"]))
    rounds_left = range(start, rounds)
    for r in tqdm(rounds_left, desc=f"{method} seed {seed}", disable=not progress, mininterval=5, initial=start):
        plan = batch_plan(parts, train["batch_size"], train["local_epochs"], plan_rng, device)
        states = local_round(clients, states, xtr, ytr, plan, train["lr"], train["momentum"], gossip, grad)
        evaluated = r % test_round == 0 or r == rounds - 1
        if evaluated:
            acc, loss = test_metrics(clients, states, xte, yte, train["eval_batch_size"])
            curves.append(
                {
                    "round": r,
                    "test_acc": float(acc.mean()),
                    "test_loss": float(loss.mean()),
                    "test_acc_min": float(acc.min()),
                    "test_acc_max": float(acc.max()),
                    "consensus": consensus_distance(states),
                }
            )
            if fabric is not None:
                fabric.log_dict({f"seed{seed}/{k}": v for k, v in curves[-1].items() if k != "round"}, step=r)
        used = list(thetas)
        fusion = round_fusion(method, states, neighbours, n, thetas, decfus["p_exchange"], fusion_rng)
        if fusion is not None:
            states = fusion.apply(states)
        variances = [np.nan] * m
        if method == "decfus" and r % test_round == 0:
            losses = local_losses(clients, states, xtr, ytr, parts, train["eval_batch_size"])
            for i in range(m):
                variances[i] = float(np.var(losses[closed_neighbourhood(neighbours, i)]))
                detectors[i].update(variances[i], r // test_round)
                thetas[i] = client_threshold(
                    detectors[i],
                    r,
                    rounds,
                    test_round,
                    decfus["theta0"],
                    decfus["theta1"],
                    decfus["steepness"],
                    decfus["midpoint"],
                    decfus["kappa"],
                )
        for i in range(m):
            rows.append(
                {
                    "round": r,
                    "client": i,
                    "theta": used[i],
                    "averaged_fraction": float(fusion.averaged[i].mean()) if fusion is not None else np.nan,
                    "variance": variances[i],
                    "stable_round": detectors[i].stable_step * test_round if detectors[i].is_stable else np.nan,
                }
            )
        if evaluated and r % max(1, rounds // 10) == 0:
            log.info("%s seed %d round %d: test acc %.4f", method, seed, r, curves[-1]["test_acc"])
        if checkpoint is not None:
            run.states = states
            checkpoint.step_done(r, [])
    if checkpoint is not None and start < rounds:
        run.states = states
        checkpoint.save(rounds, [])  # a rerun of the job loads this seed's run instead of simulating it again
    return RunResult(pd.DataFrame(curves), pd.DataFrame(rows), {k: v.cpu() for k, v in states.items()})
