"""Why st_gfn's l1_st_gfn_lam0_within_seed_noise_of_db_clean is not evidence (issue 54).

The claim: the mean over seeds of |L1(lam = 0 run) - L1(DB run)| / seed noise is below 2 (t interval over seeds).
Reading a finished run's metrics table (default results/cpu/st_gfn/metrics.parquet), this prints
1. every trained method's L1 per seed on `clean` and the claim's per-seed statistic against DB
   (paperflow.st_gfn.claims.seed_noise_gaps, the pipeline's own function), mean and 95 % t interval;
2. the same statistic for every 3-seed subset of the run's seeds (the smoke size, and the size of a held-out
   check): how often the t interval lies wholly below 2 (held), wholly above (refuted), or straddles it;
3. the statistic for two methods with one and the same L1 distribution (independent normal draws, the same
   estimator): its mean is 2 / sqrt(pi) x (a small-sample factor), below 2 whatever the methods are.
Usage, from the repository root:

    .venv/bin/python tools/diagnose/st_gfn_seed_noise.py [--metrics results/cpu/st_gfn/metrics.parquet]
"""

from __future__ import annotations

import argparse
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from paperflow.st_gfn.claims import seed_noise_gaps

TRAINED = ("db", "st_gfn_lam0", "tb", "subtb", "st_gfn")
THRESHOLD = 2.0


def t_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    mean, sem = float(np.mean(values)), float(stats.sem(values))
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * sem
    return mean, mean - half, mean + half


def gaps(l1: pd.DataFrame, seeds) -> pd.DataFrame:
    frame = l1[l1.seed.isin(seeds)].assign(metric="l1")
    return pd.DataFrame(seed_noise_gaps(frame)).pivot_table(index="seed", columns="method", values="value")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", default="results/cpu/st_gfn/metrics.parquet")
    parser.add_argument("--env", default="clean")
    parser.add_argument("--draws", type=int, default=20000, help="Monte Carlo draws for part 3")
    args = parser.parse_args()
    table = pd.read_parquet(args.metrics)
    l1 = table[(table.metric == f"{args.env}/l1") & table.method.isin(TRAINED)][["seed", "method", "value"]]
    seeds = sorted(l1.seed.unique())
    print(f"## 1. {args.env}: L1 per seed ({len(seeds)} seeds)\n")
    print(l1.pivot_table(index="seed", columns="method", values="value").to_markdown(floatfmt=".5f"))
    full = gaps(l1, seeds)
    print("\n| method | mean |L1 - L1_db| / seed noise | 95 % t interval |\n|---|---|---|")
    for method in full.columns:
        mean, lo, hi = t_interval(full[method].to_numpy())
        print(f"| {method} | {mean:.3f} | [{lo:.3f}, {hi:.3f}] |")
    print("\n## 2. every 3-seed subset: verdict of the claim (t interval against 2)\n")
    print("| method | subsets | held | inconclusive | refuted |\n|---|---|---|---|---|")
    subsets = list(combinations(seeds, 3))
    for method in full.columns:
        counts = {"held": 0, "inconclusive": 0, "refuted": 0}
        for sub in subsets:
            _, lo, hi = t_interval(gaps(l1, sub)[method].to_numpy())
            counts["held" if hi < THRESHOLD else "refuted" if lo > THRESHOLD else "inconclusive"] += 1
        print(f"| {method} | {len(subsets)} | {counts['held']} | {counts['inconclusive']} | {counts['refuted']} |")
    print("\n## 3. two methods with the same L1 distribution (normal, independent)\n")
    print("| seeds | mean statistic | P(t interval below 2) |\n|---|---|---|")
    rng = np.random.default_rng(0)
    for n in (3, len(seeds)):
        x, y = rng.normal(size=(2, args.draws, n))
        noise = (x.std(1, ddof=1) + y.std(1, ddof=1)) / 2
        stat = np.abs(x - y) / noise[:, None]
        upper = stat.mean(1) + stats.t.ppf(0.975, n - 1) * stat.std(1, ddof=1) / np.sqrt(n)
        print(f"| {n} | {stat.mean():.3f} | {np.mean(upper < THRESHOLD):.3f} |")
    print(f"\n2 / sqrt(pi) = {2 / np.sqrt(np.pi):.3f}")


if __name__ == "__main__":
    main()
