"""Why the `noise` control of dro_flow's gated ULS claims holds as well as the samplers (issue 54).

For xi = (1 + Delta) u with u ~ U[-0.5, 0.5] the test loss of a trained theta is, in closed form,
    E ||A0 theta - b + xi A1 theta||^2 / m  =  a + k (1 + Delta)^2,
    a = ||A0 theta - b||^2 / m  (the fit at xi = 0),   k = E[u^2] ||A1 theta||^2 / m = ||A1 theta||^2 / (12 m),
so the large-Delta window is decided by k and Delta = 0 by a + k. Per method this prints a and k (mean over the
run's seeds) and the second moment E_w[z^2] of the training law the method fits: the training xi for ERM, and for
the samplers their weighted particles at the trained theta (one sampler call on the whole training set per seed,
the config's `dro` block and the seed's generator); the larger E_w[z^2], the smaller the k it buys and the larger
the a it costs.

    python tools/diagnose/dro_flow_controls.py [results/cpu/dro_flow]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from paperflow.core.config import load_paper_config
from paperflow.core.io import read_frame
from paperflow.dro_flow.problems import make_problem
from paperflow.dro_flow.samplers import SAMPLERS
from paperflow.dro_flow.training import sampler_config

METHODS = ("erm", "noise", "wgf", "wfr", "wrm", "dual")


def main(root: Path) -> None:
    scale = root.parent.name
    spec = load_paper_config("dro_flow", scale)["datasets"]["uls"]
    train, meta = read_frame(root / "data" / "uls" / "train.parquet")
    problem = make_problem(train, meta, dict(spec["model"]))
    cfg = sampler_config(dict(spec["dro"]))
    x = problem.x[:, None, :]
    print(f"{root}: uls, E[xi^2] of U[-0.5, 0.5] = {1 / 12:.4f}; training xi: {float((problem.x**2).mean()):.4f}")
    print("| method | a = ‖A0 θ − b‖²/m | k = ‖A1 θ‖²/(12 m) | E_w[z²] of the fitted law | seeds |")
    print("|---|---|---|---|---|")
    for method in METHODS:
        states = torch.load(root / "models" / "uls" / f"{method}.pt", weights_only=True)
        a, k, second = [], [], []
        for seed, state in states.items():
            model = problem.build(int(seed))
            model.load_state_dict(state)
            with torch.no_grad():
                c, u = model.a0 @ model.theta - model.b, model.a1 @ model.theta
            m = c.shape[0]
            a.append(float(c @ c) / m)
            k.append(float(u @ u) / (12 * m))
            if method == "erm":
                second.append(float((problem.x**2).mean()))
            else:
                gen = torch.Generator().manual_seed(int(seed))
                parts = SAMPLERS[method](problem.energy(model, problem.y), x, cfg, gen)
                second.append(float((parts.w * (parts.z**2).sum(-1)).sum(1).mean()))
        print(f"| {method} | {np.mean(a):.4f} | {np.mean(k):.4f} | {np.mean(second):.4f} | {len(states)} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/cpu/dro_flow"))
