"""How many seeds and items the central claim of doubt needs (issue 50: "sized to decide"), from a finished run.

Reads a run's long metrics table (`metrics.parquet`, the item-level AUROC pseudo-values `auroc_item/n10`) and
splits the variance of the paired effect (DOUBT minus SE, per seed and item) into its two levels:

- sigma2: the variance of one item's effect within a seed (the pseudo-values' spread);
- tau2: the variance of the seed-level effect beyond what its items explain (Var(seed means) - sigma2 / N): each
  seed trains its own VLM, so its effect differs from the next seed's by more than its items' noise.

The core's two-level bootstrap (seeds, then items within each drawn seed) has variance close to
(Var(seed means) + sigma2 / N) / S = (tau2 + 2 sigma2 / N) / S (the item noise enters once through the seed means
and once through the items' resampling); this reproduces the run's own interval (printed beside it). For designs of
S seeds x N items it prints the expected standard error, the 95 % interval's half-width, the power to decide (the
normal approximation, P(|estimate| > 1.96 SE) at the run's effect), the smallest effect decided with 80 % power
(2.80 SE), and the wall time on 2 cores from the run's own per-seed and per-item costs (`--per-seed-s`,
`--per-item-s`, `--fixed-s`: seconds of jobs, measured from the benchmarks of a run, README).

Usage, from the repository root:
  .venv/bin/python tools/diagnose/doubt_power.py --metrics results/cpu/doubt/metrics.parquet
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm


def components(metrics: Path, method: str, baseline: str, metric: str) -> dict[str, float]:
    frame = pd.read_parquet(metrics)
    part = frame[frame["metric"] == metric].pivot_table(index=["seed", "unit"], columns="method", values="value")
    effect = (part[method] - part[baseline]).dropna()
    by_seed = effect.groupby(level="seed")
    means, sizes = by_seed.mean(), by_seed.size()
    n_items = float(sizes.mean())
    sigma2 = float(by_seed.var(ddof=1).mean())
    var_means = float(means.var(ddof=1))
    tau2 = max(0.0, var_means - sigma2 / n_items)
    return {
        "effect": float(effect.mean()),
        "seeds": int(len(means)),
        "items_per_seed": n_items,
        "sigma2": sigma2,
        "var_seed_means": var_means,
        "tau2": tau2,
        "bootstrap_se_now": float(np.sqrt((var_means + sigma2 / n_items) / len(means))),
    }


def design(c: dict[str, float], seeds: int, items: int) -> dict[str, float]:
    se = float(np.sqrt((c["tau2"] + 2 * c["sigma2"] / items) / seeds))
    z = abs(c["effect"]) / se
    return {
        "seeds": seeds,
        "items": items,
        "se": se,
        "half_width": 1.96 * se,
        "power_at_effect": float(norm.sf(1.96 - z) + norm.cdf(-1.96 - z)),
        "effect_80pct_power": 2.80 * se,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=Path, default=Path("results/cpu/doubt/metrics.parquet"))
    parser.add_argument("--method", default="doubt")
    parser.add_argument("--baseline", default="se_plain")
    parser.add_argument("--metric", default="auroc_item/n10")
    parser.add_argument("--seeds", type=int, nargs="+", default=[12, 20, 24, 30, 36, 40, 60, 80])
    parser.add_argument("--items", type=int, nargs="+", default=[1000, 2000])
    parser.add_argument("--per-seed-s", type=float, default=None, help="job seconds per seed (training)")
    parser.add_argument("--per-item-s", type=float, default=None, help="job seconds per test item and seed")
    parser.add_argument("--fixed-s", type=float, default=0.0, help="job seconds independent of the size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    c = components(args.metrics, args.method, args.baseline, args.metric)
    rows = [design(c, s, n) for n in args.items for s in args.seeds]
    if args.per_seed_s is not None and args.per_item_s is not None:
        for r in rows:
            r["wall_min_2_cores"] = (args.fixed_s + r["seeds"] * (args.per_seed_s + r["items"] * args.per_item_s)) / 120
    if args.json:
        print(json.dumps({"components": c, "designs": rows}, indent=1))
        return
    print(
        f"effect {c['effect']:+.4f} over {c['seeds']} seeds x {c['items_per_seed']:.0f} items; sigma2 (item, within seed) "
        f"{c['sigma2']:.4f}; Var(seed means) {c['var_seed_means']:.2e}; tau2 (seed) {c['tau2']:.2e}; "
        f"bootstrap SE now {c['bootstrap_se_now']:.4f} (half-width {1.96 * c['bootstrap_se_now']:.4f})"
    )
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.4f}"))


if __name__ == "__main__":
    main()
