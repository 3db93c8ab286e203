"""Linear heads on cached text embeddings: ERM, GroupDRO (Sagawa et al. 2020, exponentiated-gradient
weights over the identity x label slices) and LV-Group [R]:
(1 - eps) sum_g q_g E_g[loss] + eps sup_{Xi0} loss, the sup of the logistic loss over the X-ellipsoid in
closed form, max_y log(1 + exp(-y (theta^T mu + theta0) + t ||Sigma^{1/2} theta||)).
Full-batch Adam: the features are cached and small, so one step is one pass.

The step (GroupDRO's weight update, then the objective) lives in `HeadObjective`; two engines drive it
(`text.train.engine`):
- `loop` (tiny, smoke, cpu): the plain torch loop `fit_loop`; importing Lightning costs about 4 s of CPU per job on
  top of torch, more than these fits take.
- `lightning` (paper): Lightning Fabric (`paperflow.credal_dro.lightning`, imported only there) drives the same
  loop on the job's device, one Fabric per seed, its objective logged through CSV (and wandb) loggers.
On the CPU both give the same heads bit for bit (tests check it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paperflow.core.loop import run_loop
from paperflow.core.resume import row_journal
from paperflow.credal_dro.tables import features
from paperflow.credal_dro.text import slice_accuracy

ENGINES = ("loop", "lightning")


class HeadObjective(torch.nn.Module):
    """The linear head (w, b) and the GroupDRO slice weights q; calling it is one step's objective (for the
    group methods it first moves q by the exponentiated-gradient rule on the detached slice losses)."""

    def __init__(
        self,
        method: str,
        eps: float,
        x: np.ndarray,
        label: np.ndarray,
        group: np.ndarray,
        bulk_doc: Mapping[str, Any] | None,
        cfg: Mapping[str, Any],
    ):
        super().__init__()
        self.method, self.eps, self.group_step = method, eps, cfg["group_step"]
        X, y = torch.tensor(x, dtype=torch.float32), torch.tensor(2.0 * label - 1.0, dtype=torch.float32)
        masks = np.array(
            [(group == g) & (label == c) for g in np.unique(group[group >= 0]) for c in (0, 1)], dtype=float
        )
        masks = masks[masks.sum(axis=1) > 0]
        slice_mean = torch.tensor(
            masks / masks.sum(axis=1, keepdims=True), dtype=torch.float32
        )  # (slices, n): per-slice mean loss
        self.w = torch.nn.Parameter(torch.zeros(x.shape[1]))
        self.b = torch.nn.Parameter(torch.zeros(1))
        self.register_buffer("X", X)
        self.register_buffer("y", y)
        self.register_buffer("slice_mean", slice_mean)
        self.register_buffer("q", torch.ones(len(masks)) / len(masks))
        if bulk_doc is not None:
            blk = bulk_doc["blocks"][0]
            self.t = blk["t"]
            self.register_buffer("mu", torch.tensor(blk["mu"], dtype=torch.float32))
            self.register_buffer("root", torch.linalg.cholesky(torch.tensor(blk["shape"], dtype=torch.float32)))

    def forward(self) -> torch.Tensor:
        w, b = self.w, self.b
        losses = torch.nn.functional.softplus(-self.y * (self.X @ w + b))
        if self.method == "erm":
            return losses.mean()
        per = self.slice_mean @ losses
        q = self.q * torch.exp(self.group_step * per.detach())
        self.q = q / q.sum()
        obj = (self.q * per).sum()
        if self.method == "lv_group":
            spread = self.t * torch.linalg.norm(self.root.T @ w)
            centre = self.mu @ w + b
            sup = torch.maximum(
                torch.nn.functional.softplus(-centre + spread), torch.nn.functional.softplus(centre + spread)
            )
            obj = (1 - self.eps) * obj + self.eps * sup.squeeze()
        return obj


def fit_loop(head: HeadObjective, opt: torch.optim.Optimizer, epochs: int) -> None:
    """The plain loop (`paperflow.core.loop.run_loop`): `epochs` full-batch Adam steps, no progress bar (a job runs
    many fits of a second each)."""
    run_loop(lambda _: head(), opt, epochs, progress=False)


def _fit(head: HeadObjective, opt: torch.optim.Optimizer, epochs: int, engine: str, fabric: Any, step0: int) -> None:
    if engine == "loop":
        fit_loop(head, opt, epochs)
        return
    if engine == "lightning":
        from paperflow.credal_dro.lightning import fit_fabric

        fit_fabric(fabric, head, opt, epochs, step0)
        return
    raise ValueError(f"text.train.engine = {engine!r}: not one of {ENGINES}")


def train_head(
    method: str,
    eps: float,
    x: np.ndarray,
    label: np.ndarray,
    group: np.ndarray,
    bulk_doc: Mapping[str, Any] | None,
    cfg: Mapping[str, Any],
    seed: int,
    fabric: Any = None,
    step0: int = 0,
) -> tuple[np.ndarray, float]:
    """Full-batch Adam on a linear head (features are cached; one batch per step), driven by the engine
    `cfg["engine"]`; with the lightning engine, `fabric` is the seed's Fabric (its logged steps
    start at `step0`)."""
    torch.manual_seed(seed)
    head = HeadObjective(method, eps, x, label, group, bulk_doc, cfg)
    opt = torch.optim.Adam(head.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    _fit(head, opt, cfg["epochs"], cfg["engine"], fabric, step0)
    return head.w.detach().cpu().numpy().astype(float), float(head.b.item())


def train_text(
    method: str,
    splits: Mapping[int, Mapping[str, Any]],
    bulks: Mapping[str, dict],
    cfg: Mapping[str, Any],
    seeds: list[int],
    run_dir: str | Path | None = None,
    wandb: Mapping[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    journal: str | Path | None = None,
) -> dict:
    """Every grid value per seed; the chosen one has the best worst-slice accuracy on the select split.
    With `train.engine: lightning`, one Fabric per seed drives that seed's fits, logging to
    run_dir/csv/seed<seed>/metrics.csv (and wandb when enabled). Each finished fit is a row of the `journal`
    (a file in the job's checkpoint folder; a scratch file when None): a rerun of a killed job takes the finished
    fits from it and fits only the rest (each fit seeds itself, so the others do not depend on them)."""
    with row_journal(journal) as done:
        grid = list(cfg["methods"][method])
        engine = cfg["train"]["engine"]
        out = {"experiment": "text", "method": method, "grid": grid, "seeds": {}}
        for seed in seeds:
            fit, select = splits[seed]["fit"], splits[seed]["select"]
            t0 = time.perf_counter()
            fabric = None
            if engine == "lightning":
                from paperflow.core.training import make_fabric, make_loggers

                if run_dir is None:
                    raise ValueError("text.train.engine = 'lightning' needs a run_dir for its loggers")
                fabric = make_fabric(make_loggers(run_dir, f"seed{seed}", wandb, tags or {}))
            fits = []
            for k, value in enumerate(grid):
                row_id = f"seed{seed}/grid{k}"
                if row_id not in done:
                    theta, theta0 = train_head(
                        method,
                        value,
                        features(fit),
                        fit["label"].to_numpy(),
                        fit["group"].to_numpy(),
                        bulks[str(seed)] if method == "lv_group" else None,
                        cfg["train"],
                        seed,
                        fabric,
                        k * cfg["train"]["epochs"],
                    )
                    acc = slice_accuracy(
                        features(select) @ theta + theta0, select["label"].to_numpy(), select["group"].to_numpy()
                    )
                    done.append(
                        {
                            "id": row_id,
                            "param": float(value),
                            "theta": theta.tolist(),
                            "theta0": theta0,
                            "select_worst_acc": acc["worst_slice_acc"],
                        }
                    )
                (row,) = done.complete([row_id])  # the fit as the journal holds it, fresh or from before a kill
                fits.append({key: row[key] for key in ("param", "theta", "theta0", "select_worst_acc")})
            if fabric is not None:
                from paperflow.core.training import finish_fabric

                finish_fabric(fabric)
            chosen = max(fits, key=lambda f: f["select_worst_acc"])
            out["seeds"][str(seed)] = {"grid": fits, "chosen": chosen, "runtime_s": time.perf_counter() - t0}
        return out
