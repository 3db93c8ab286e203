"""Why mtbl_wc's quad_wc_feasible (every WC run ends with ||h|| < 1e-2) fails on some cpu seeds (issue 54).

It reads the WC histories of a finished run (the pipeline's own evaluations, every `eval_every` steps) and prints,
per seed, the max over preferences of ||h|| at a few steps, the penalty weight rho_t = min(rho_max, rho_0 (1 + t /
ramp)) of the scale's solver at that step, and rho_t x ||h||. A constant rho_t x ||h|| while rho ramps, and a
||h|| that stops moving once rho_t reaches rho_max, say that the residual is the penalty's bias (a stationary point
of sum w_s f_s + rho / 2 ||h||^2 has ||h|| of order 1 / rho), not a step budget: more steps at rho_max = 100 leave
it where it is, and ||h|| < 1e-2 needs rho_max above the printed rho_t x ||h|| / 1e-2. Usage, from the repository
root, after the run:

    .venv/bin/python tools/diagnose/mtbl_wc_feasibility.py [--scale cpu] [--steps 1000 4000 16000 18000 20000]
"""

from __future__ import annotations

import argparse

import pandas as pd

from paperflow.core.config import load_paper_config
from paperflow.mtbl_wc.algorithm import penalty_schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu", help="the config scale (its results folder, seeds and solver)")
    parser.add_argument("--steps", type=int, nargs="+", default=[1000, 4000, 16000, 18000, 20000])
    args = parser.parse_args()
    cfg = load_paper_config("mtbl_wc", args.scale)
    solver = cfg["problems"]["quadratic"]["solver"]
    print("| seed | " + " | ".join(f"step {t}: max ||h|| (rho_t x it)" for t in args.steps) + " |")
    print("|---" * (len(args.steps) + 1) + "|")
    for seed in cfg["seeds"]:
        hist = pd.read_parquet(f"results/{args.scale}/mtbl_wc/runs/quadratic/wc/seed{seed}_history.parquet")
        h = hist.groupby("step").h_norm.max()
        cells = [f"{h.loc[t]:.4g} ({penalty_schedule(t, solver) * h.loc[t]:.3g})" for t in args.steps]
        print(f"| {seed} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
