"""Where DOUBT's AUROC against semantic entropy comes from, on a finished run (doubt, issue 50).

Reads `results/<scale>/doubt/eval/items.parquet` (labels, every detector's score at n = 10, the plain set's largest
semantic cluster) and the sampled sets (`samples/seed*.parquet`), and prints, pooled over seeds:

- every detector's AUROC, and DOUBT's and vMF's AUROC with the plain set split by agreement: on the items whose plain
  set is semantically unanimous (one meaning in all 10 answers) SE is 0 for every item and ranks nothing, so what
  DOUBT adds over SE must come from ranking inside that group (its object-first set, or the wording);
- inside the unanimous group, the rank correlation of vMF's trust score (centred Rbar of the plain set) with the
  number of distinct strings of the set, and with the label: if Rbar follows the wording and not the label there,
  the centring counts strings (issue 50), and its variation is noise to the detector;
- the same for the object-first set B (vMF on B) and for the DOUBT score.

Usage, from the repository root: .venv/bin/python tools/diagnose/doubt_central.py [--scale cpu]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from paperflow.core.io import read_frame
from paperflow.doubt.metrics import auroc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="cpu")
    args = parser.parse_args()
    root = Path("results") / args.scale / "doubt"
    items = read_frame(root / "eval" / "items.parquet")[0]
    sets = pd.concat(
        [read_frame(p)[0][["seed", "item", "A", "B"]] for p in sorted((root / "samples").glob("seed*.parquet"))]
    )
    items = items.merge(sets, on=["seed", "item"])
    items["distinct_A"] = items["A"].map(lambda a: len(set(a)))
    items["distinct_B"] = items["B"].map(lambda a: len(set(a)))
    n_max = int(items["A"].map(len).max())
    methods = sorted(c.removeprefix("score_") for c in items.columns if c.startswith("score_"))

    def per_seed_auroc(frame: pd.DataFrame, method: str) -> float:
        values = [auroc(g["wrong"].to_numpy(), g[f"score_{method}"].to_numpy()) for _, g in frame.groupby("seed")]
        return float(np.nanmean(values))

    print(
        f"{args.scale}: {items['seed'].nunique()} seeds, {len(items)} items, wrong rate {items['wrong'].mean():.3f}\n"
    )
    print("| method | AUROC (mean over seeds) |\n|---|---|")
    for m in methods:
        print(f"| {m} | {per_seed_auroc(items, m):.4f} |")
    unanimous = items[items["largest_plain_cluster"] == n_max]
    split = items[items["largest_plain_cluster"] < n_max]
    print(
        f"\nPlain set semantically unanimous: {len(unanimous)} items ({len(unanimous) / len(items):.3f}), wrong rate "
        f"{unanimous['wrong'].mean():.3f}; split: {len(split)} items, wrong rate {split['wrong'].mean():.3f}.\n"
    )
    print("| method | AUROC inside the unanimous group | AUROC inside the split group |\n|---|---|---|")
    for m in ("doubt", "vmf_plain", "vmf_oub", "doubt_nodebias", "se_plain", "lexical"):
        if m in methods:
            print(f"| {m} | {per_seed_auroc(unanimous, m):.4f} | {per_seed_auroc(split, m):.4f} |")
    print("\nInside the unanimous group, Spearman rank correlations (trust = -score):\n")
    print("| score | with distinct strings of its set | with the label (wrong) |\n|---|---|---|")
    for m, column in (("vmf_plain", "distinct_A"), ("vmf_oub", "distinct_B"), ("doubt", "distinct_A")):
        if m in methods:
            trust = -unanimous[f"score_{m}"]
            r_strings = spearmanr(trust, unanimous[column]).statistic
            r_label = spearmanr(trust, unanimous["wrong"].astype(float)).statistic
            print(f"| {m} | {r_strings:.3f} ({column}) | {r_label:.3f} |")


if __name__ == "__main__":
    main()
