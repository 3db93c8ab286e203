"""Why decfus's θ-end claims hold or fail at a scale (issue 54): per seed, when each client's detector fires
and where its θ ends.

θ_i follows Eq. 6 after client i's detector fires at round t_s: θ = θ0 − σ(k (p − m)) (θ0 − θ1) with
p = (r − t_s) / (κ R), updated at the evaluation rounds (every `test_round`); the last round fuses with the θ
computed at the last evaluation round r_u before it. So θ ≤ 0.30 in the last round needs p ≥ m + ln(9) / k,
i.e. t_s ≤ r_u − (m + ln 9 / k) κ R, and a fraction of averaged tensors of 6/8 (the percentile cutoff at
q = 100 θ over 8 per-tensor similarities puts 6 tensors above it only while 7 θ < 2) needs θ < 2/7, i.e.
t_s ≤ r_u − (m + ln 13 / k) κ R. This prints, per partition and seed, the clients' firing rounds, the latest
firing round that still reaches each bound, how many clients fire later, and the run's logged last-round θ and
averaged fraction next to the closed form recomputed from the firing rounds alone (so the verdicts are seen to
follow from the firing rounds), and a θ trajectory (largest client θ at a few fractions of R).

    python tools/diagnose/decfus_schedule.py [results/cpu/decfus]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from paperflow.core.config import load_paper_config
from paperflow.decfus.schedule import threshold_at


def latest_firing(r_u: int, rounds: int, theta: float, cfg: dict) -> float:
    """Latest t_s whose θ at round r_u is at most `theta` (strictly below for the 2/7 bound)."""
    share = (cfg["theta0"] - theta) / (cfg["theta0"] - cfg["theta1"])
    p = cfg["midpoint"] + math.log(share / (1 - share)) / cfg["steepness"]
    return r_u - p * cfg["kappa"] * rounds


def main(root: Path) -> None:
    scale = root.parent.name
    cfg = load_paper_config("decfus", scale)
    dec, rounds, test_round = cfg["decfus"], cfg["train"]["rounds"], cfg["train"]["test_round"]
    last = rounds - 1
    r_u = max(r for r in range(last) if r % test_round == 0)  # θ used in the last round was set here
    t30 = latest_firing(r_u, rounds, 0.30, dec)
    t27 = latest_firing(r_u, rounds, 2 / 7, dec)
    print(
        f"{root}: R = {rounds}, test_round = {test_round}, protection {dec['protection'] * rounds:.0f} rounds; "
        f"θ of the last round set at round {r_u}; θ ≤ 0.30 needs t_s ≤ {t30:.1f}, θ < 2/7 (6 of 8 tensors "
        f"averaged) needs t_s ≤ {t27:.1f}"
    )
    fractions = (0.25, 0.5, 0.75, 0.9)
    for dataset in cfg["run_datasets"]:
        for partition in cfg["run_partitions"]:
            folder = root / "runs" / dataset / partition / "decfus"
            clients = pd.concat(pd.read_csv(f) for f in sorted(folder.glob("*/clients.csv")))
            print(f"\n## {dataset} {partition}\n")
            print(
                "| seed | firing rounds t_s (sorted) | after bound 0.30 | after 2/7 | θ max last (logged / closed form) "
                "| averaged last (logged / closed form) | θ max at " + ", ".join(f"{f:g}R" for f in fractions) + " |"
            )
            print("|---|---|---|---|---|---|---|")
            summary = []
            for seed, frame in clients.groupby("seed"):
                end = frame[frame["round"] == last].sort_values("client")
                ts = end["stable_round"].to_numpy()
                fired = ts[~np.isnan(ts)]
                theta_cf = np.array(
                    [
                        dec["theta0"]
                        if np.isnan(t) or t > r_u
                        else threshold_at(
                            (r_u - t) / (dec["kappa"] * rounds),
                            dec["theta0"],
                            dec["theta1"],
                            dec["steepness"],
                            dec["midpoint"],
                        )
                        for t in ts
                    ]
                )
                # 8 tensors: cutoff at numpy percentile q = 100 θ; 6 above it while 7 θ < 2, 5 while 7 θ < 3, ...
                averaged_cf = np.mean([(8 - 1 - math.floor(7 * t)) / 8 for t in theta_cf])
                trajectory = [frame[frame["round"] == int(f * rounds)]["theta"].max() for f in fractions]
                late30 = int((ts > t30).sum() + np.isnan(ts).sum())
                late27 = int((ts > t27).sum() + np.isnan(ts).sum())
                summary.append((seed, fired.max() if len(fired) else np.nan, late30, late27, end["theta"].max()))
                print(
                    f"| {seed} | {', '.join(f'{t:.0f}' for t in sorted(fired))}"
                    f"{' (+' + str(len(ts) - len(fired)) + ' never)' if len(fired) < len(ts) else ''} "
                    f"| {late30} | {late27} | {end['theta'].max():.4f} / {theta_cf.max():.4f} "
                    f"| {end['averaged_fraction'].mean():.4f} / {averaged_cf:.4f} "
                    f"| {', '.join(f'{v:.3f}' for v in trajectory)} |"
                )
            table = pd.DataFrame(summary, columns=["seed", "last_firing", "late30", "late27", "theta_max"])
            print(
                f"\nlast firing round per seed: median {table.last_firing.median():.0f} "
                f"({table.last_firing.median() / rounds:.2f} R), range {table.last_firing.min():.0f}-"
                f"{table.last_firing.max():.0f}; seeds with a client past the 0.30 bound: "
                f"{int((table.late30 > 0).sum())} of {len(table)}; clients past it: {table.late30.sum()} of "
                f"{len(table) * cfg['clients']}; past the 2/7 bound: {table.late27.sum()}"
            )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/cpu/decfus"))
