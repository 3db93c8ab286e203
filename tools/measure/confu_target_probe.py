"""The probe behind `cpu.target.train.steps` of config/confu.yaml (issue 49: "the target reaches the spec's
accuracy"): the cpu scale's target is trained through the pipeline's own function (paperflow.confu.stages.
train_target) for each step count asked, on the cpu run's problems, and its greedy exact match per task is printed
(spec section 7: >= 0.98 on sort). Only the target is trained: no draft and no claim is looked at, so the step count
is chosen on the spec's target accuracy alone. Run `snakemake --cores 2 --config scale=cpu papers=[confu] --until
confu_download` first (it writes the problems).

Usage, from the repository root (one process per step count; two fit 2 cores side by side):
  PYTHONPATH=modules .venv/bin/python tools/measure/confu_target_probe.py --steps 1200 1600 2000
"""

from __future__ import annotations

import argparse
import time

import pandas as pd
import torch

from paperflow.confu.stages import greedy_exact, train_target
from paperflow.core.config import load_paper_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", required=True, help="target training steps to try")
    ap.add_argument("--problems", default="results/cpu/confu/raw/problems.parquet")
    args = ap.parse_args()
    torch.set_num_threads(1)  # as a pipeline job with threads 1
    whole = load_paper_config("confu", "cpu")
    problems = pd.read_parquet(args.problems)
    test = problems[problems.split == "test"].reset_index(drop=True)
    seed = int(whole["target"]["seed"])
    for steps in args.steps:
        target = whole["target"] | {"train": whole["target"]["train"] | {"steps": steps}}
        cfg = {"data": whole["data"], "target": target}
        start = time.perf_counter()
        model, rows = train_target(problems, cfg, seed)
        wall = time.perf_counter() - start
        exact = greedy_exact(model, test, cfg)
        tasks = ", ".join(f"{task} {acc:.3f}" for task, acc in exact.items())
        print(f"steps {steps}: final loss {rows[-1]['loss']:.4f}, greedy exact match {tasks}, {wall:.0f} s", flush=True)


if __name__ == "__main__":
    main()
