"""The learning-rate probe behind `pretrained_cpu.lr` of config/lozo_plus.yaml (issue 52): one ZO method fine-tunes
the cpu scale's real pretrained model (SmolLM2-135M-Instruct, offline) on the generated reviews for a short budget
at one learning rate, through the pipeline's own function (paperflow.lozo_plus.paper.train), and prints the train
loss curve, the wall time and the dev accuracy. It reads the cpu run's prepared model folder and data, so run
`snakemake --cores 2 --config scale=cpu papers=[lozo_plus] --until lozo_plus_lm_preprocess` first.

Usage, from the repository root (one probe per process; two fit 2 cores side by side):
  PYTHONPATH=modules .venv/bin/python tools/measure/lozo_plus_lr_probe.py --method lozo --lr 3e-5 --budget 200
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from paperflow.core.config import load_paper_config
from paperflow.lozo_plus import paper


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", required=True, choices=["mezo", "lozo", "lozoplus"])
    ap.add_argument("--lr", required=True, type=float)
    ap.add_argument("--budget", type=int, default=200, help="forward passes (the cpu run's pretrained_cpu.run.budget)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", default="results/cpu/lozo_plus/lm")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a pipeline job with threads 1
    whole = load_paper_config("lozo_plus", "cpu")
    lm = whole["pretrained_cpu"]
    cfg = {
        "pretrained": lm["pretrained"],
        "run": lm["run"] | {"budget": args.budget, "eval_every": 50},
        "zo": whole["zo"],
        "lr": {args.method: args.lr},
        "ft": whole["ft"],
        "gpus": 1,
    }
    base = Path(args.results)
    pretrained, task = str(base / "models" / "pretrained.json"), lm["task"]["name"]
    with tempfile.TemporaryDirectory() as tmp:
        out = {
            k: f"{tmp}/{k}.{'safetensors' if k == 'models' else 'csv'}"
            for k in ("models", "curve", "log", "align", "summary")
        }
        start = time.time()
        summary = paper.train(
            task, args.method, [args.seed], pretrained, str(base / "data" / task / "train.parquet"), cfg, out
        )
        wall = time.time() - start
        curve = pd.read_csv(out["curve"])[["forwards", "train_loss", "train_accuracy"]]
        dev = {"dev": str(base / "data" / task / "dev.parquet")}
        ev = paper.evaluate(task, args.method, [args.seed], pretrained, out["models"], dev, cfg)
    print(f"{args.method} lr {args.lr:g} seed {args.seed}: {summary['forwards']} forwards in {wall:.1f} s")
    print(curve.to_string(index=False))
    print(f"dev loss {float(ev['dev_loss'].iloc[0]):.4f}, dev accuracy {float(ev['dev_accuracy'].iloc[0]):.4f}")


if __name__ == "__main__":
    main()
