"""DOUBT's claims, tables, figure and report (spec sections 7, 8, 10 and 11).

Gated: C1 as amended (spec 11: paraphrased answers, a semantic clusterer for SE): at n = 3 and 5, the vMF Rbar on
the plain set has an AUROC at least SE's and a smaller spread over random sub-samplings of the 10 samples; DOUBT
detects above chance (AUROC > 0.55, set before any run); the shuffled control (answer sets moved across items)
falls to chance (|AUROC - 0.5| <= 0.05). Reported: C2 (DOUBT vs vMF on A, with a paired bootstrap CI) and C3
(share of "consistent but wrong" answers DOUBT flags vs SE)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import plots
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table
from paperflow.doubt import metrics
from paperflow.doubt.methods import METHODS

DETECTS_ABOVE = 0.55  # DOUBT's AUROC must beat chance by this much (fixed before any run)
CHANCE_BAND = 0.05  # the shuffled control's |AUROC - 0.5| must stay inside this
CONSISTENT_SHARE = 0.8  # C3: "the plain set agrees at least 8/10"


def metric(frame: pd.DataFrame, method: str, n: int, column: str, seeds) -> list[float]:
    m = frame[(frame["method"] == method) & (frame["n"] == n)].set_index("seed")
    return [float(m.loc[s, column]) if s in m.index else float("nan") for s in seeds]


def c1_claims(frame: pd.DataFrame, seeds, ns=(3, 5), vmf: str = "vmf_plain", se: str = "se_plain") -> list[Claim]:
    out = []
    for n in ns:
        a_v, a_s = metric(frame, vmf, n, "auroc", seeds), metric(frame, se, n, "auroc", seeds)
        s_v, s_s = (metric(frame, m, n, "auroc_std_subsamples", seeds) for m in (vmf, se))
        out.append(
            compare_claim(
                id=f"c1_auroc_n{n}",
                statement=f"C1: AUROC(vMF Rbar on A) - AUROC(SE on A) at n = {n} (mean over sub-samplings)",
                values=[v - s for v, s in zip(a_v, a_s)],
                seeds=seeds,
                comparison=">=",
                threshold=0.0,
            )
        )
        out.append(
            compare_claim(
                id=f"c1_stability_n{n}",
                statement=f"C1: std of AUROC over sub-samplings at n = {n}, vMF minus SE (vMF more stable: < 0)",
                values=[v - s for v, s in zip(s_v, s_s)],
                seeds=seeds,
                comparison="<",
                threshold=0.0,
            )
        )
    return out


def detection_claims(frame: pd.DataFrame, seeds, n_max: int, method: str = "doubt") -> list[Claim]:
    auc = metric(frame, method, n_max, "auroc", seeds)
    shuffled = metric(frame, method, n_max, "auroc_shuffled", seeds)
    return [
        compare_claim(
            id="doubt_detects",
            statement=f"DOUBT's AUROC at n = {n_max} (positive = ans0 wrong)",
            values=auc,
            seeds=seeds,
            comparison=">",
            threshold=DETECTS_ABOVE,
        ),
        compare_claim(
            id="shuffled_control_chance",
            statement="Negative control: answer sets shuffled across items, |AUROC(DOUBT) - 0.5|",
            values=[abs(v - 0.5) for v in shuffled],
            seeds=seeds,
            comparison="<=",
            threshold=CHANCE_BAND,
        ),
    ]


def c2_claim(frame: pd.DataFrame, seeds, n_max: int, ci: tuple[float, float, float]) -> Claim:
    a, b = metric(frame, "doubt", n_max, "auroc", seeds), metric(frame, "vmf_plain", n_max, "auroc", seeds)
    return compare_claim(
        id="c2_doubt_vs_vmf_plain",
        statement=f"C2: AUROC(DOUBT, A and B) - AUROC(vMF on A) at n = {n_max}; pooled paired bootstrap 95% CI "
        f"[{ci[1]:.3f}, {ci[2]:.3f}]",
        values=[x - y for x, y in zip(a, b)],
        seeds=seeds,
        comparison=">",
        threshold=0.0,
        gated=False,
        limitation="the spec expects a positive sign but does not guarantee it at toy scale",
    )


def consistent_wrong(items: pd.DataFrame, n_max: int) -> pd.DataFrame:
    """Per seed: wrong answers whose plain set's largest semantic cluster holds >= 80% of the samples, and the
    shares of them DOUBT and SE flag at their official thresholds; beside them, the shares of ALL items each
    flags (a detector that flags everything also flags every consistent-but-wrong answer)."""
    rows = []
    for seed, g in items.groupby("seed"):
        sub = g[g["wrong"] & (g["largest_plain_cluster"] >= CONSISTENT_SHARE * n_max)]
        rows.append(
            {
                "seed": int(seed),
                "consistent_wrong": len(sub),
                "doubt_flags": float(sub["flag_doubt"].mean()) if len(sub) else np.nan,
                "se_flags": float(sub["flag_se_plain"].mean()) if len(sub) else np.nan,
                "doubt_flags_all_items": float(g["flag_doubt"].mean()),
                "se_flags_all_items": float(g["flag_se_plain"].mean()),
            }
        )
    return pd.DataFrame(rows)


def c3_claim(cw: pd.DataFrame, seeds) -> Claim:
    by = cw.set_index("seed")
    return compare_claim(
        id="c3_consistent_but_wrong",
        statement="C3: among wrong answers whose plain set agrees >= 8/10, share flagged by DOUBT minus share "
        "flagged by SE (official thresholds 0.48 and 1.0; the shares of all items flagged are in the C3 table)",
        values=[float(by.loc[s, "doubt_flags"] - by.loc[s, "se_flags"]) for s in seeds],
        seeds=seeds,
        comparison=">",
        threshold=0.0,
        gated=False,
    )


def pooled_bootstrap(items: pd.DataFrame, reps: int, seed: int) -> tuple[float, float, float]:
    """AUROC(DOUBT) - AUROC(vMF on A) at n_max over all seeds' items, with a paired bootstrap CI."""
    wrong = items["wrong"].to_numpy()
    return metrics.bootstrap_auroc_diff(
        wrong, items["score_doubt"].to_numpy(), items["score_vmf_plain"].to_numpy(), reps, seed
    )


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    g = frame.groupby(["method", "n"])
    return pd.DataFrame(
        {
            "auroc_mean": g["auroc"].mean(),
            "auroc_std_seeds": g["auroc"].std(ddof=1),
            "auroc_std_subsamples": g["auroc_std_subsamples"].mean(),
            "detection_accuracy": g["detection_accuracy"].mean(),
            "auroc_shuffled": g["auroc_shuffled"].mean(),
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
    seeds = [int(s) for s in params["seeds"]]
    n_max = int(params["sampling"]["n_max"])
    ci = pooled_bootstrap(items, int(params["evaluation"]["bootstrap"]), int(params["evaluation"]["seed"]))
    cw = consistent_wrong(items, n_max)
    claims = [
        *c1_claims(frame, seeds, [n for n in params["scoring"]["ns"] if n < n_max]),
        *detection_claims(frame, seeds, n_max),
        c2_claim(frame, seeds, n_max, ci),
        c3_claim(cw, seeds),
    ]
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
            f"({clusterer['dev_surfaces']} surfaces; pair accuracy {clusterer['dev_pair_accuracy']:.3f}).",
        ),
        (
            "C1 in detail: vMF vs SE on the plain set below n_max (mean over seeds)",
            markdown_table(
                [
                    {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()}
                    for r in table[table["method"].isin(["vmf_plain", "se_plain"]) & (table["n"] < n_max)]
                    .drop(columns=["detection_accuracy", "auroc_shuffled"])
                    .to_dict("records")
                ]
            )
            + "\n\n`distinct_values`: distinct scores over the test items in one sub-sampling (SE at n = 3 can take "
            "only a few; with paraphrases Rbar takes many).",
        ),
        ("C3: consistent but wrong", markdown_table(cw.round(3).to_dict("records"))),
    ]
    return Report(
        title="DOUBT: object-first prompting and a vMF trust score (grid scenes, tiny LLaVA-style VLM)",
        summary="A tiny VLM (16 noisy cell vectors -> prefix embeddings -> 2-layer Llama) answers questions about "
        "grid scenes in paraphrased surfaces, with a built-in language prior. For each test item it samples a plain "
        "answer set A and, after listing the objects, an object-first set B; detectors score the sets without the "
        "ground truth, and the AUROC of detecting a wrong ans0 is measured per seed.",
        claims=claims,
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
            "c2_pooled_ci": [v if np.isfinite(v) else None for v in ci],
        },
    )
