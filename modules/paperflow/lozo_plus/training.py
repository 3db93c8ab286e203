"""Pretraining on the source task, and fine-tuning on the target at a fixed forward budget (spec sections 7, 8).

Every forward on a training batch is counted by the kit's `ForwardCounter` on the model; that count F is the
x-axis of every curve. The train loss of the unperturbed model on a fixed 256-example subset (every
`eval_every` forwards) and the autograd capture-ratio probe (every `probe_every` steps) run with the counter
paused: they are outside the budget. Zeroth-order steps run on the core loop in manual mode
(`run_loop(step, None, steps)`); the first-order reference and the pretraining on it with AdamW.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paperflow.core.lm.models import ForwardCounter
from paperflow.core.loop import LoopCheckpoint, run_loop
from paperflow.core.resume import EVERY_S
from paperflow.lozo_plus import ceiling, zo
from paperflow.lozo_plus import model as lm
from paperflow.lozo_plus import task as tk

DATA = 101  # purpose key of the batch stream's seed (zo's purposes are 0-4)


@dataclass
class Split:
    ids: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def head(self, n: int) -> Split:
        return Split(self.ids[:n], self.labels[:n])

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of rows `idx`: the arguments of `SyntheticScorer.loss` after the model."""
        return self.ids[idx], self.labels[idx]


class SyntheticScorer:
    """The classifier of the smoke task (paperflow.lozo_plus.model): the label words' logits at SEP. A paper-scale
    run passes `paperflow.lozo_plus.pretrained.LabelWordScorer` instead (same two methods)."""

    @staticmethod
    def loss(model, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return lm.loss(model, ids, labels)

    @staticmethod
    def evaluate(model, split: Split) -> tuple[float, float]:
        return lm.evaluate(model, split.ids, split.labels)


def split_of(ids: np.ndarray, labels: np.ndarray) -> Split:
    return Split(torch.as_tensor(ids, dtype=torch.long), torch.as_tensor(labels, dtype=torch.long))


def pretrain(model_cfg: Mapping[str, Any], cfg: Mapping[str, Any], checks: Mapping[str, Split]):
    """The source model: AdamW on fresh source-task batches (spec 7: lr 3e-3, 600 steps, batch 64); its history
    holds the accuracy on each split of `checks` every `eval_every` steps and at the end."""
    seed = int(cfg["seed"])
    model = lm.new_model(model_cfg, seed)
    rng = np.random.default_rng(zo.derive_seed(seed, DATA))
    opt = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]))
    history = []

    def check(step: int) -> None:
        model.eval()
        row = {"step": step}
        for name, s in checks.items():
            row[f"{name}_loss"], row[f"{name}_accuracy"] = lm.evaluate(model, s.ids, s.labels)
        history.append(row)
        model.train()

    def step(i: int):
        ids, y = tk.generate("source", int(cfg["batch_size"]), rng)
        out = lm.loss(model, torch.as_tensor(ids), torch.as_tensor(y))
        if (i + 1) % int(cfg["eval_every"]) == 0 and i + 1 < int(cfg["steps"]):
            check(i + 1)
        return out

    model.train()
    check(0)
    run_loop(step, opt, int(cfg["steps"]), desc="pretrain")
    check(int(cfg["steps"]))
    return model.eval(), history


class Budgeted:
    """The training stream of one fine-tuning run: seeded batches, the counted loss, the paused evaluations. `scorer`
    scores a batch (`loss(model, *batch)`) and a split (`evaluate(model, split)`); `train` draws a batch with
    `take(idx)`."""

    def __init__(self, model, train, seed: int, batch_size: int, eval_subset: int, scorer=SyntheticScorer):
        self.model = model
        self.scorer = scorer
        self.train = train
        self.eval_set = train.head(eval_subset)
        self.counter = ForwardCounter(model)
        self.rng = np.random.default_rng(zo.derive_seed(seed, DATA))
        self.batch_size = batch_size
        self.batch = None
        self.curve: list[dict[str, float]] = []

    def draw(self) -> None:
        idx = torch.as_tensor(self.rng.choice(len(self.train), self.batch_size, replace=False))
        self.batch = self.train.take(idx)

    def batch_loss(self) -> float:
        """L(theta; B_t), one counted forward."""
        with torch.inference_mode():
            return float(self.scorer.loss(self.model, *self.batch))

    def record(self, step: int) -> None:
        with self.counter.paused():
            loss_, acc = self.scorer.evaluate(self.model, self.eval_set)
        self.curve.append({"forwards": self.counter.calls, "step": step, "train_loss": loss_, "train_accuracy": acc})

    def state_dict(self) -> dict[str, Any]:
        """What the stream carries between steps (for paperflow.core.loop.LoopCheckpoint): the batch generator's
        state, the forward counts and the curve so far (the batch is drawn afresh by each step)."""
        return {
            "rng": self.rng.bit_generator.state,
            "counter": {"calls": self.counter.calls, "rows": self.counter.rows, "tokens": self.counter.tokens},
            "curve": plain_rows(self.curve),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        for name, value in state["counter"].items():
            setattr(self.counter, name, int(value))
        self.curve[:] = state["curve"]

    def gradients(self, params) -> list[torch.Tensor]:
        """Autograd gradient of the batch loss (the probe; not counted)."""
        with self.counter.paused(), torch.enable_grad():
            out = self.scorer.loss(self.model, *self.batch)
            return list(torch.autograd.grad(out, list(params)))


def mezo_cosine(opt: zo.ZeroOrder, c: float, grads: list[torch.Tensor]) -> float:
    """cos(c z, grad L) for MeZO (spec 8: its stand-in for the capture ratio)."""
    dot = zz = gg = 0.0
    for (_, z, _), g in zip(opt.pieces(), grads):
        dot, zz, gg = dot + float((z * g).sum()), zz + float(z.pow(2).sum()), gg + float(g.pow(2).sum())
    return math.copysign(1.0, c) * dot / math.sqrt(zz * gg) if zz * gg > 0 else float("nan")


def spectrum_row(grads: list[torch.Tensor], s: zo.Settings) -> dict[str, float]:
    """The gradient's spectrum at a refresh step and the capture-ratio ratio over LOZO's that LOZO+'s selection should
    reach on it (paperflow.lozo_plus.ceiling; defined for one column per candidate and the pool-max threshold):
    the energy share of each matrix's top singular component, of the largest matrix, and the participation number
    of the matrices' energies (1: one matrix holds it all)."""
    spectra = ceiling.spectra(grads)
    e = np.concatenate(spectra)
    n = np.concatenate([np.full(len(sp), g.shape[1], float) for sp, g in zip(spectra, grads)])
    per = np.array([sp.sum() for sp in spectra])
    tops = [sp[0] for sp in spectra]
    most = max(1, s.r_max // s.candidate_rank)
    closed = s.candidate_rank == 1 and s.threshold_mode == "pool_max"
    return {
        "rho_ratio_closed_form": ceiling.rho_ratio(e, n, s.candidates, s.kappa, most, s.rank) if closed else math.nan,
        "spectrum_top1_share": sum(tops) / per.sum(),
        "spectrum_largest_matrix_share": per.max() / per.sum(),
        "spectrum_matrices_participation": per.sum() ** 2 / (per**2).sum(),
    }


def plain_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with numpy scalars as the Python numbers they equal (a checkpoint loads with torch's weights_only)."""
    return [{k: v.item() if isinstance(v, np.generic) else v for k, v in r.items()} for r in rows]


class Progress:
    """The run's own bookkeeping between steps, as an object LoopCheckpoint saves: the probe rows so far and the
    forward count at which the next curve point is due."""

    def __init__(self, next_eval: int) -> None:
        self.probes: list[dict[str, float]] = []
        self.next_eval = next_eval

    def state_dict(self) -> dict[str, Any]:
        return {"probes": plain_rows(self.probes), "next_eval": self.next_eval}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.probes[:] = state["probes"]
        self.next_eval = int(state["next_eval"])


def finetune_zo(
    model,
    method: str,
    settings: zo.Settings,
    train,
    seed: int,
    run: Mapping[str, Any],
    scorer=SyntheticScorer,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float = EVERY_S,
):
    """One ZO run of `method` from `model` (changed in place) until the forward budget `run.budget` is spent, on
    `train` scored by `scorer` (the smoke task's by default). `run.probe_every` 0 turns the autograd probe off.
    Returns (curve rows, per-step log rows, probe rows).

    checkpoint_dir: resume from, and save into, `<checkpoint_dir>/loop.pt` (paperflow.core.loop.LoopCheckpoint,
    at most every `checkpoint_every_s` seconds): the weights, the ZO optimiser's state (its step, LOZO's kept V and
    refresh state, LOZO-M's momentum, LOZO+'s last refresh), the batch generator, the forward counts, the curve,
    probe and log rows, and the global generators; a rerun ends as an uninterrupted run does. None: no checkpoint."""
    stream = Budgeted(model, train, seed, int(run["batch_size"]), int(run["eval_subset"]), scorer)
    opt = zo.make(method, model.parameters(), settings, seed)
    budget, eval_every, probe_every = int(run["budget"]), int(run["eval_every"]), int(run["probe_every"])
    progress = Progress(eval_every)
    probes = progress.probes
    checkpoint = None
    if checkpoint_dir is not None:
        objects = {"model": model, "optimizer": opt, "stream": stream, "progress": progress}
        checkpoint = LoopCheckpoint(checkpoint_dir, objects, checkpoint_every_s)
    model.eval()

    def probe(o: zo.ZeroOrder, c: float) -> None:
        refresh = isinstance(o, zo.LOZO) and o.last_refresh == o.t
        if not probe_every or (o.t % probe_every and not refresh):
            return
        row = {"step": o.t, "forwards": stream.counter.calls, "refresh": float(refresh)}
        if isinstance(o, zo.MeZO):
            row["cosine"] = mezo_cosine(o, c, stream.gradients(o.params))
        else:
            bases = o.subspaces()
            grads = stream.gradients(o.matrices)  # the step's batch: at a refresh, the one that scored the candidates
            row["rho"], row["rho_unweighted"] = zo.capture_ratio(grads, [bases[p] for p in o.matrices])
            energy = [float(g.pow(2).sum()) for g in grads]
            ranks = [bases[p].shape[1] / p.shape[1] for p in o.matrices]
            row["rho_random_expected"] = math.sqrt(sum(e * r for e, r in zip(energy, ranks)) / sum(energy))
            row["rank"] = float(np.mean([bases[p].shape[1] for p in o.matrices]))
            if refresh:
                row |= spectrum_row(grads, o.s)
        probes.append(row)

    def step(i: int):
        if stream.counter.calls + opt.step_cost() > budget:
            return float("nan"), {"done": 1.0}
        stream.draw()
        logs = opt.step(stream.batch_loss, probe)
        if stream.counter.calls >= progress.next_eval:
            stream.record(opt.t)
            progress.next_eval += eval_every
        return logs["loss_plus"], {**logs, "forwards": float(stream.counter.calls), "done": 0.0}

    if checkpoint is None or not checkpoint.path.exists():  # a resumed run's curve comes back with its checkpoint
        stream.record(0)
    records = run_loop(step, None, budget // 2, desc=f"{method} seed {seed}", checkpoint=checkpoint)
    if stream.curve[-1]["forwards"] != stream.counter.calls:
        stream.record(opt.t)
    stream.counter.close()
    log = [r for r in records if not r["done"]]
    return stream.curve, log, probes


def finetune_fo(model, cfg: Mapping[str, Any], train: Split, seed: int, run: Mapping[str, Any]):
    """The first-order reference: AdamW for `cfg.steps` steps of `run.batch_size` rows (one counted forward each,
    plus its backward). Returns (curve rows, per-step log rows, no probe rows)."""
    stream = Budgeted(model, train, seed, int(run["batch_size"]), int(run["eval_subset"]))
    opt = torch.optim.AdamW(model.parameters(), lr=float(cfg["lr"]), weight_decay=float(cfg["weight_decay"]))
    every = int(cfg["eval_every"])

    def step(i: int):
        stream.draw()
        out = lm.loss(model, *stream.batch)
        return out, {"forwards": float(stream.counter.calls)}

    def after(record: dict[str, float]) -> None:
        if (record["step"] + 1) % every == 0:
            stream.record(int(record["step"]) + 1)

    model.train()
    stream.record(0)
    records = run_loop(step, opt, int(cfg["steps"]), desc=f"ft seed {seed}", on_step=after)
    if stream.curve[-1]["forwards"] != stream.counter.calls:
        stream.record(int(cfg["steps"]))
    stream.counter.close()
    return stream.curve, records, []
