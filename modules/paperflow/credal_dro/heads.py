"""Linear heads on cached text embeddings: ERM, GroupDRO (Sagawa et al. 2020, exponentiated-gradient
weights over the identity x label slices) and LV-Group [R]:
(1 - eps) sum_g q_g E_g[loss] + eps sup_{Xi0} loss, the sup of the logistic loss over the X-ellipsoid in
closed form, max_y log(1 + exp(-y (theta^T mu + theta0) + t ||Sigma^{1/2} theta||)).
Full-batch Adam: the features are cached and small, so one step is one pass; no Lightning.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from paperflow.credal_dro.tables import features
from paperflow.credal_dro.text import slice_accuracy


def train_head(
    method: str,
    eps: float,
    x: np.ndarray,
    label: np.ndarray,
    group: np.ndarray,
    bulk_doc: Mapping[str, Any] | None,
    cfg: Mapping[str, Any],
    seed: int,
) -> tuple[np.ndarray, float]:
    """Full-batch Adam on a linear head (features are cached; one batch per step)."""
    torch.manual_seed(seed)
    X, y = torch.tensor(x, dtype=torch.float32), torch.tensor(2.0 * label - 1.0, dtype=torch.float32)
    masks = np.array([(group == g) & (label == c) for g in np.unique(group[group >= 0]) for c in (0, 1)], dtype=float)
    masks = masks[masks.sum(axis=1) > 0]
    slice_mean = torch.tensor(
        masks / masks.sum(axis=1, keepdims=True), dtype=torch.float32
    )  # (slices, n): per-slice mean loss
    w = torch.zeros(x.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    q = torch.ones(len(masks)) / len(masks)
    if bulk_doc is not None:
        blk = bulk_doc["blocks"][0]
        mu, root = (
            torch.tensor(blk["mu"], dtype=torch.float32),
            torch.linalg.cholesky(torch.tensor(blk["shape"], dtype=torch.float32)),
        )
    for _ in range(cfg["epochs"]):
        losses = torch.nn.functional.softplus(-y * (X @ w + b))
        if method == "erm":
            obj = losses.mean()
        else:
            per = slice_mean @ losses
            q = q * torch.exp(cfg["group_step"] * per.detach())
            q = q / q.sum()
            obj = (q * per).sum()
            if method == "lv_group":
                spread = blk["t"] * torch.linalg.norm(root.T @ w)
                centre = mu @ w + b
                sup = torch.maximum(
                    torch.nn.functional.softplus(-centre + spread), torch.nn.functional.softplus(centre + spread)
                )
                obj = (1 - eps) * obj + eps * sup.squeeze()
        opt.zero_grad()
        obj.backward()
        opt.step()
    return w.detach().numpy().astype(float), float(b.item())


def train_text(
    method: str,
    splits: Mapping[int, Mapping[str, Any]],
    bulks: Mapping[str, dict],
    cfg: Mapping[str, Any],
    seeds: list[int],
) -> dict:
    """Every grid value per seed; the chosen one has the best worst-slice accuracy on the select split."""
    grid = list(cfg["methods"][method])
    out = {"experiment": "text", "method": method, "grid": grid, "seeds": {}}
    for seed in seeds:
        fit, select = splits[seed]["fit"], splits[seed]["select"]
        t0 = time.perf_counter()
        fits = []
        for value in grid:
            theta, theta0 = train_head(
                method,
                value,
                features(fit),
                fit["label"].to_numpy(),
                fit["group"].to_numpy(),
                bulks[str(seed)] if method == "lv_group" else None,
                cfg["train"],
                seed,
            )
            acc = slice_accuracy(
                features(select) @ theta + theta0, select["label"].to_numpy(), select["group"].to_numpy()
            )
            fits.append(
                {
                    "param": float(value),
                    "theta": theta.tolist(),
                    "theta0": theta0,
                    "select_worst_acc": acc["worst_slice_acc"],
                }
            )
        chosen = max(fits, key=lambda f: f["select_worst_acc"])
        out["seeds"][str(seed)] = {"grid": fits, "chosen": chosen, "runtime_s": time.perf_counter() - t0}
    return out
