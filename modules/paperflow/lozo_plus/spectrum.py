"""The source model's gradient spectrum on training batches and the closed-form capture-ratio ratio it allows
(paperflow.lozo_plus.ceiling): how the threshold of the mechanism claim was derived (README, "The threshold").

    python -m paperflow.lozo_plus.spectrum results/cpu/lozo_plus [--batches 20] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def measure(
    source: str, train: str, batches: int, batch_size: int, seed: int, settings
) -> tuple[pd.DataFrame, pd.Series]:
    """(one `training.spectrum_row` per batch, each matrix's mean share of the gradient energy)."""
    import torch

    from paperflow.core.lm.models import load_checkpoint
    from paperflow.lozo_plus import training, zo
    from paperflow.lozo_plus.stages import read_split

    torch.set_num_threads(1)
    model = load_checkpoint(source).eval()
    split = read_split(train)
    named = [(n, p) for n, p in model.named_parameters() if p.dim() >= 2]
    rng = np.random.default_rng(zo.derive_seed(seed, training.DATA))
    rows, shares = [], []
    for _ in range(batches):
        ids, y = split.take(torch.as_tensor(rng.choice(len(split), batch_size, replace=False)))
        grads = list(torch.autograd.grad(training.SyntheticScorer.loss(model, ids, y), [p for _, p in named]))
        rows.append(training.spectrum_row(grads, settings))
        energy = np.array([float(g.double().pow(2).sum()) for g in grads])
        shares.append(energy / energy.sum())
    return pd.DataFrame(rows), pd.Series(np.mean(shares, 0), index=[n for n, _ in named])


def main() -> None:
    from paperflow.core.config import load_paper_config
    from paperflow.lozo_plus import zo

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a results/<scale>/lozo_plus folder (its models/source.safetensors, data/train)")
    ap.add_argument("--scale", default="cpu")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    cfg = load_paper_config("lozo_plus", args.scale)
    root = Path(args.results)
    rows, shares = measure(
        str(root / "models" / "source.safetensors"),
        str(root / "data" / "train.parquet"),
        args.batches,
        int(cfg["run"]["batch_size"]),
        args.seed,
        zo.settings_from(cfg, "lozoplus"),
    )
    print(rows.describe().T[["mean", "std", "min", "max"]].round(4).to_markdown())
    print()
    print(shares.round(4).rename("energy share").to_markdown())


if __name__ == "__main__":
    main()
