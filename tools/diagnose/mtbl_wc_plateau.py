"""Why mtbl_wc's concave-front claim fails on seeds 1 and 2 at smoke scale (issue 19).

For each smoke seed it runs WC on the concave (Fonseca-Fleming) instance from the pipeline's own starting point with
the smoke solver, and again with more steps, and prints per middle preference the relative distance (objective
space) of the best-K output and of the last iterate to the closed-form WC point, the objectives at the start, and
the K of the output. Usage, from the repository root:

    .venv/bin/python tools/diagnose/mtbl_wc_plateau.py [--steps 5000 20000 80000] [--scale cpu] [--seeds 1 2 3]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from paperflow.core.config import load_paper_config
from paperflow.mtbl_wc import fronts
from paperflow.mtbl_wc.algorithm import run
from paperflow.mtbl_wc.experiment import build_problem, starting_point
from paperflow.mtbl_wc.prepare import preference_matrix


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[5000, 20000, 80000])
    parser.add_argument("--scale", default="smoke", help="the config scale whose seeds and solver are used")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="a subset of that scale's seeds")
    args = parser.parse_args()
    cfg = load_paper_config("mtbl_wc", args.scale)
    spec = cfg["problems"]["concave"]
    prefs = preference_matrix([0.35, 0.5, 0.65])
    print("| seed | steps | f at start | rel. dist. of best-K output | of last iterate | K of output |")
    print("|---|---|---|---|---|---|")
    for seed in args.seeds if args.seeds is not None else cfg["seeds"]:
        inst = fronts.concave_instance(spec["instance"], seed)
        exact = fronts.concave_front(inst, prefs, 101)
        problem = build_problem("concave", inst)
        z0 = starting_point("concave", problem, inst, len(prefs), seed)
        objectives = lambda z: problem.objectives(torch.as_tensor(z)).numpy()  # noqa: B023
        rel = lambda z: np.linalg.norm(objectives(z) - exact["f_wc"], axis=1) / np.linalg.norm(exact["f_wc"], axis=1)  # noqa: B023,E731
        for steps in args.steps:
            solver = spec["solver"] | {"steps": steps, "eval_every": max(steps // 20, 1)}
            res = run(problem, "wc", prefs, z0, exact["ideal"], solver, seed)
            k_out = res.history.groupby("pref").K_best.min().to_numpy()
            fmt = lambda a: ", ".join(f"{v:.3g}" for v in a)  # noqa: E731
            print(
                f"| {seed} | {steps} | ({fmt(objectives(z0[:1])[0])}) | {fmt(rel(res.z_best))} | "
                f"{fmt(rel(res.z_final))} | {fmt(k_out)} |"
            )


if __name__ == "__main__":
    main()
