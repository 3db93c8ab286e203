"""DOUBT's metrics table, tables, figure and report (spec sections 7, 8, 10 and 11; issue 50).

The claims are declared in config/doubt.yaml and judged by paperflow.core.claims on `metrics_table`: per method, seed
and n the AUROC (mean over sub-samplings), its spread over sub-samplings and the detection accuracy; at n_max, per
(seed, item), the AUROC pseudo-values (`metrics.auroc_pseudo_values`: their item mean is the AUROC) that pair two
detectors' AUROCs item by item, and per seed every thresholded detector's flag rates. Gated there: DOUBT's AUROC above
semantic entropy's at n = 10 (central; control: vMF on the plain set only), and vMF's smaller spread than SE's at
n = 3 and 5 (control: entropy over exact strings); each also judged, reported, with the debias centring off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import plots
from paperflow.core.claims import fmt, long_table
from paperflow.core.report import Figure, Report, Table, markdown_table
from paperflow.doubt import metrics
from paperflow.doubt.methods import METHODS

CONSISTENT_SHARE = 0.8  # C3: "the plain set agrees at least 8/10"
FLAGGED = tuple(m for m, method in METHODS.items() if method.statistic.startswith(("rbar", "se")))  # a threshold


def metrics_table(frame: pd.DataFrame, items: pd.DataFrame, params: Mapping[str, Any]) -> pd.DataFrame:
    """The long metrics table the claims of config/doubt.yaml are judged on: per (method, seed), at every n of
    `scoring.ns`, the AUROC (mean over sub-samplings), its std over sub-samplings and the detection accuracy at the
    official threshold (methods that have one); at n_max, per (seed, item), `auroc_item` (the AUROC pseudo-values of
    every method whose scores `items` holds), and per seed, for the methods with an official threshold, the share of
    all items flagged and of the consistent-but-wrong ones (C3; NaN on a seed without any: no data)."""
    n_max = int(params["sampling"]["n_max"])
    rows = []

    def add(method, seed, metric, value, unit=None):
        rows.append({"seed": int(seed), "unit": unit, "method": method, "metric": metric, "value": float(value)})

    for r in frame.itertuples():
        for column in ("auroc", "auroc_std_subsamples", "detection_accuracy"):
            value = getattr(r, column)
            if column != "detection_accuracy" or np.isfinite(value):
                add(r.method, r.seed, f"{column}/n{r.n}", value)
    scored = [c.removeprefix("score_") for c in items.columns if c.startswith("score_")]
    for seed, g in items.groupby("seed") if len(items) else []:
        for m in scored:
            values = metrics.auroc_pseudo_values(g["wrong"].to_numpy(), g[f"score_{m}"].to_numpy())
            for item, v in zip(g["item"], values):
                add(m, seed, f"auroc_item/n{n_max}", v, unit=str(int(item)))
    for m in FLAGGED:
        if f"flag_{m}" in items and items[f"flag_{m}"].notna().any():
            for seed, rates in flag_rates(items, m, n_max).iterrows():
                add(m, seed, f"flag_rate/n{n_max}", rates["all"])
                add(m, seed, f"flag_rate_consistent_wrong/n{n_max}", rates["consistent_wrong"])
    return long_table(rows, params["scale"])


def flag_rates(items: pd.DataFrame, method: str, n_max: int) -> pd.DataFrame:
    """Per seed: the share of all items `method` flags at its official threshold, and of the wrong answers whose
    plain set's largest semantic cluster holds >= 80% of the samples (C3; NaN where a seed has none)."""
    out = {}
    for seed, g in items.groupby("seed"):
        sub = g[g["wrong"] & (g["largest_plain_cluster"] >= CONSISTENT_SHARE * n_max)]
        flags = f"flag_{method}"
        out[int(seed)] = {
            "all": float(g[flags].mean()),
            "consistent_wrong": float(sub[flags].mean()) if len(sub) else np.nan,
        }
    return pd.DataFrame.from_dict(out, orient="index")


def consistent_wrong(items: pd.DataFrame, n_max: int) -> pd.DataFrame:
    """Per seed: the number of wrong answers whose plain set's largest semantic cluster holds >= 80% of the samples,
    and the shares of them DOUBT and SE flag at their official thresholds; beside them, the shares of ALL items each
    flags (a detector that flags everything also flags every consistent-but-wrong answer)."""
    sub = items["wrong"] & (items["largest_plain_cluster"] >= CONSISTENT_SHARE * n_max)
    doubt, se = flag_rates(items, "doubt", n_max), flag_rates(items, "se_plain", n_max)
    return pd.DataFrame(
        {
            "seed": doubt.index.astype(int),
            "consistent_wrong": sub.groupby(items["seed"]).sum().reindex(doubt.index).to_numpy(),
            "doubt_flags": doubt["consistent_wrong"].to_numpy(),
            "se_flags": se["consistent_wrong"].to_numpy(),
            "doubt_flags_all_items": doubt["all"].to_numpy(),
            "se_flags_all_items": se["all"].to_numpy(),
        }
    )


def flag_rate_summary(items: pd.DataFrame, n_max: int) -> dict[str, dict[str, float | None]]:
    """Per method with an official threshold: the share of all items and of the consistent-but-wrong ones it flags,
    mean over seeds (metrics.json; per seed in the metrics table)."""
    out = {}
    for m in FLAGGED:
        if f"flag_{m}" in items and items[f"flag_{m}"].notna().any():
            rates = flag_rates(items, m, n_max).mean()
            out[m] = {k: (float(v) if np.isfinite(v) else None) for k, v in rates.items()}
    return out


def surface_variety_by_seed(items: pd.DataFrame) -> pd.DataFrame:
    """Per seed and set (A, B): the share of answers phrased otherwise than their meaning's modal surface, of the
    answers that share a meaning with another of their set (`surfaces.surface_variety`, pooled over the items)."""
    out = {}
    for seed, g in items.groupby("seed"):
        out[int(seed)] = {
            s: float(g[f"variety_off_{s}"].sum() / max(g[f"variety_counted_{s}"].sum(), 1)) for s in ("A", "B")
        }
    return pd.DataFrame.from_dict(out, orient="index")


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    g = frame.groupby(["method", "n"])
    return pd.DataFrame(
        {
            "auroc_mean": g["auroc"].mean(),
            "auroc_std_seeds": g["auroc"].std(ddof=1),
            "auroc_std_subsamples": g["auroc_std_subsamples"].mean(),
            "detection_accuracy": g["detection_accuracy"].mean(),
            "distinct_values": g["distinct_values"].mean(),
        }
    ).reset_index()


def figure_auroc(table: pd.DataFrame):
    fig, axes = plots.subplots(2)
    for method, g in table.groupby("method"):
        g = g.sort_values("n")
        axes[0].plot(g["n"], g["auroc_mean"], marker="o", label=method)
        axes[1].plot(g["n"], g["auroc_std_subsamples"], marker="o", label=method)
    axes[0].set(xlabel="samples per set n", ylabel="AUROC (mean over seeds)", title="Detection")
    axes[1].set(xlabel="samples per set n", ylabel="std of AUROC over sub-samplings", title="Stability")
    axes[0].legend(fontsize=6)
    return fig


def build_report(
    frame: pd.DataFrame, items: pd.DataFrame, clusterer: Mapping[str, Any], params: Mapping[str, Any]
) -> Report:
    n_max = int(params["sampling"]["n_max"])
    cw = consistent_wrong(items, n_max)
    variety = surface_variety_by_seed(items)
    flags = flag_rate_summary(items, n_max)
    table = summary_table(frame)
    wrong = items.groupby("seed")["wrong"].mean()
    by_sigma = items.groupby("sigma")["wrong"].mean()
    lines = [
        {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()}
        for r in table[table["n"] == n_max].to_dict("records")
    ]
    sections = [
        (
            f"Detectors at n = {n_max} (mean over seeds)",
            markdown_table(lines)
            + "\n\nMethods: "
            + "; ".join(f"`{m}`: {METHODS[m].description}" for m in sorted(set(table["method"])))
            + ".",
        ),
        (
            "The tiny VLM's answers",
            "Share of ans0 wrong (the positives) per seed: "
            + ", ".join(f"{int(s)}: {v:.3f}" for s, v in wrong.items())
            + " (spec target 0.20-0.40). By scene noise sigma: "
            + ", ".join(f"{s}: {v:.3f}" for s, v in by_sigma.items())
            + f". Semantic clusterer: MiniLM cosine > {clusterer['threshold']:.3f}, chosen on the dev paraphrase set "
            f"({clusterer['dev_surfaces']} surfaces; pair accuracy {clusterer['dev_pair_accuracy']:.3f}).\n\n"
            f"Surface variety of the sampled sets (answers phrased otherwise than their meaning's most common surface, "
            f"of those sharing a meaning with another answer of their set; configured `train.surface_variety` = "
            f"{fmt(params['train']['surface_variety'])}, the measurement of tools/measure/doubt_surface_variety.py):\n\n"
            + markdown_table(
                [
                    {"seed": s, "plain set A": fmt(r["A"]), "object-first set B": fmt(r["B"])}
                    for s, r in variety.iterrows()
                ]
                + [
                    {
                        "seed": "mean",
                        "plain set A": fmt(variety["A"].mean()),
                        "object-first set B": fmt(variety["B"].mean()),
                    }
                ]
            ),
        ),
        (
            "C1 in detail: vMF vs SE on the plain set below n_max (mean over seeds)",
            markdown_table(
                [
                    {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()}
                    for r in table[table["method"].isin(["vmf_plain", "se_plain"]) & (table["n"] < n_max)]
                    .drop(columns=["detection_accuracy"])
                    .to_dict("records")
                ]
            )
            + "\n\n`distinct_values`: distinct scores over the test items in one sub-sampling (SE at n = 3 can take "
            "only a few; with paraphrases Rbar takes many).",
        ),
        ("C3: consistent but wrong", markdown_table(cw.round(3).to_dict("records"))),
        (
            "Flag rates at the official thresholds (mean over seeds)",
            markdown_table(
                [
                    {"method": m, "all items": fmt(r["all"]), "consistent but wrong": fmt(r["consistent_wrong"])}
                    for m, r in flags.items()
                ]
            )
            + "\n\nDOUBT and vMF flag iff the trust score <= 0.48, the entropies iff U >= 1.0 (official thresholds); "
            + ", ".join(f"`{m}`" for m in sorted(set(table["method"]) - set(flags)))
            + " have no official threshold. Per seed in `metrics.parquet` (`flag_rate/n<n_max>`).",
        ),
    ]
    return Report(
        title="DOUBT: object-first prompting and a vMF trust score (grid scenes, tiny LLaVA-style VLM)",
        summary="A tiny VLM (16 noisy cell vectors -> prefix embeddings -> 2-layer Llama) answers questions about "
        "grid scenes, now and then in a paraphrase (as often as SmolLM2-135M-Instruct was measured to), with a "
        "built-in language prior. For each test item it samples a plain "
        "answer set A and, after listing the objects, an object-first set B; detectors score the sets without the "
        "ground truth, and the AUROC of detecting a wrong ans0 is measured per seed.",
        table=metrics_table(frame, items, params),
        sections=sections,
        figures=[Figure("figure_auroc", "AUROC and its sub-sampling spread vs n", figure_auroc(table))],
        tables=[Table("table_detectors", "Per method and n: AUROC, stability, detection accuracy", table)],
        limitations=[
            "No real MLLM, benchmark, LLM judge or entailment model: exact match of the parsed answer replaces the "
            "judge, and a MiniLM-cosine clusterer (threshold chosen on dev) replaces LLM entailment (spec 7, 11).",
            "The paper's table numbers were not available (spec section 5); no paper value is compared.",
            "C3 compares flags at the fixed official thresholds: read it beside the shares of ALL items each method "
            "flags (C3 table); a detector that flags nearly every item also flags every consistent-but-wrong one.",
        ],
        metrics={
            "summary": table.astype(object).where(table.notna(), None).to_dict("records"),
            "clusterer": dict(clusterer),
            "flag_rates": flags,
            "surface_variety": {
                "configured": float(params["train"]["surface_variety"]),
                "sampled_by_seed": {str(k): v for k, v in variety.to_dict("index").items()},
            },
        },
    )
