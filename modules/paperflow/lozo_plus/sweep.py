"""The one-off learning-rate choice of spec section 7: each ZO method at the forward budget from the source model,
seed `sweep.seed`, over `sweep.grid` (the low-rank methods' grid divided by r, as their estimator has no 1/r);
the dev accuracy (ties: dev loss) picks the value recorded in config/lozo_plus.yaml `lr`. Not part of the DAG
(run once, by hand); the README lists its table.

    python -m paperflow.lozo_plus.sweep --scale smoke --methods mezo lozo --out sweep.csv
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

from paperflow.core.config import load_paper_config, repo_root
from paperflow.lozo_plus import prepare, stages, training, zo
from paperflow.lozo_plus.model import evaluate

LOW_RANK = ("lozo", "lozom", "lozoplus")


def grid_of(method: str, cfg) -> list[float]:
    scale = 1.0 / cfg["zo"]["rank"] if method in LOW_RANK else 1.0
    return [float(x) * scale for x in cfg["sweep"]["grid"]]


def run(cfg, methods, folder: Path) -> pd.DataFrame:
    from paperflow.core.lm.models import load_checkpoint

    paths = {s: str(folder / f"{s}.parquet") for s in ("train", "dev", "test", "source_test")}
    prepare.download(cfg["source"], cfg["data"], str(folder / "raw.parquet"))
    prepare.preprocess(str(folder / "raw.parquet"), paths)
    source = str(folder / "source.safetensors")
    stages.pretrain(cfg["model"], cfg["pretrain"], paths["source_test"], paths["test"], source)
    train, dev = stages.read_split(paths["train"]), stages.read_split(paths["dev"])
    seed, rows = int(cfg["sweep"]["seed"]), []
    for method in methods:
        base = zo.settings_from(cfg, method)
        for lr in grid_of(method, cfg):
            model = load_checkpoint(source)
            curve, _, _ = training.finetune_zo(model, method, replace(base, lr=lr), train, seed, cfg["run"])
            dev_loss, dev_acc = evaluate(model, dev.ids, dev.labels)
            rows.append({"method": method, "lr": lr, "dev_accuracy": dev_acc, "dev_loss": dev_loss, **curve[-1]})
            print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--methods", nargs="+", default=["mezo", "lozo", "lozom", "lozoplus"])
    ap.add_argument("--out", default="lozo_plus_sweep.csv")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    cfg = load_paper_config("lozo_plus", args.scale, repo_root())
    with tempfile.TemporaryDirectory() as tmp:
        frame = run(cfg, args.methods, Path(tmp))
    frame.to_csv(args.out, index=False)
    best = frame.sort_values(["dev_accuracy", "dev_loss"], ascending=[False, True]).groupby("method").head(1)
    print(best[["method", "lr", "dev_accuracy", "dev_loss", "train_loss"]].to_string(index=False))


if __name__ == "__main__":
    main()
