"""SpecFlow's metrics table (judged by the claims of config/specflow.yaml), tables and figures from the evaluation
frames (spec sections 5, 7, 10 and 11)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.claims import long_table
from paperflow.core.report import Figure, Report, Table, fmt, markdown_table
from paperflow.specflow.settings import COLUMNS, claim_metric

# spec section 5: LLaVA-1.5-7B, the unpruned upper bound and SpecFlow at 64 tokens, per benchmark
UPPER_576 = {"GQA": 61.9, "MMB": 64.7, "MMB-CN": 58.1, "MME": 1862, "POPE": 85.9, "SQA": 69.5, "VQAv2": 78.4,
             "TextVQA": 58.2, "VizWiz": 50.0}  # fmt: skip
SPECFLOW_64 = {"GQA": 55.3, "MMB": 63.7, "MMB-CN": 54.3, "MME": 1713, "POPE": 80.5, "SQA": 69.7, "VQAv2": 73.7,
               "TextVQA": 54.9, "VizWiz": 52.4}  # fmt: skip
TABLE1_AVERAGE_64 = {"SpecFlow": 95.6, "VisionZip": 94.5, "ToMe": 70.1}


def relative_average(scores: Mapping[str, float], upper: Mapping[str, float] = UPPER_576) -> float:
    """Table 1's "Average" (%): the mean over the benchmarks present of score / unpruned score (section 8)."""
    keys = [k for k in scores if k in upper and scores[k] is not None]
    return 100 * float(np.mean([scores[k] / upper[k] for k in keys]))


def metrics_table(frame: pd.DataFrame, scale: str) -> pd.DataFrame:
    """The long metrics table the claims of config/specflow.yaml are judged on: per seed, method, task and ratio its
    relative accuracy (pruned / full-token accuracy of the same seed), accuracy and object coverage, named
    "<task>/<column>@<ratio>" (settings.claim_metric); NaN where a method has no such number (coverage of a
    pooling method)."""
    rows = [
        {"seed": r["seed"], "method": r["method"], "metric": claim_metric(r["task"], c, r["ratio"]), "value": r[c]}
        for r in frame.to_dict("records")
        for c in COLUMNS
    ]
    return long_table(rows, scale)


def summary_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds per task, method and ratio."""
    g = frame.groupby(["task", "method", "ratio", "budget", "k_fed"])
    out = g.agg(
        relative=("relative", "mean"), relative_std=("relative", "std"), accuracy=("accuracy", "mean"),
        full_accuracy=("full_accuracy", "mean"), coverage=("coverage", "mean"), coverage_std=("coverage", "std"),
        prune_ms=("prune_ms", "mean"), seeds=("seed", "nunique"),
    )  # fmt: skip
    return out.reset_index()


def table1_frame() -> pd.DataFrame:
    """Acceptance check 5: Table 1's average recomputed from the per-benchmark numbers the spec holds (SpecFlow's;
    VisionZip's and ToMe's per-benchmark rows are not in the spec, so only their published averages are listed)."""
    ours = relative_average(SPECFLOW_64)
    return pd.DataFrame([
        {"method": "SpecFlow", "paper_average": TABLE1_AVERAGE_64["SpecFlow"], "recomputed": round(ours, 1)},
        {"method": "VisionZip", "paper_average": TABLE1_AVERAGE_64["VisionZip"], "recomputed": None},
        {"method": "ToMe", "paper_average": TABLE1_AVERAGE_64["ToMe"], "recomputed": None},
    ])  # fmt: skip


def curves_figure(table: pd.DataFrame, column: str, methods: Sequence[str], ylabel: str):
    from paperflow.core import plots

    fig, axes = plots.subplots(2, width=5.0, height=3.8)
    for ax, task in zip(axes, ("count", "control")):
        sub = table[table.task == task]
        for m in methods:
            row = sub[sub.method == m].sort_values("ratio")
            if row.empty or row[column].isna().all():
                continue
            style = {"lw": 2.5, "color": "k"} if m == "specflow" else {"lw": 1.0}
            ax.errorbar(100 * row.ratio, row[column], yerr=row[f"{column}_std"].fillna(0), label=m, marker="o",
                        ms=3, capsize=2, **style)  # fmt: skip
        ax.set_xlabel("pruning ratio (%)")
        ax.set_ylabel(ylabel)
        ax.set_title("counting (1-5 objects)" if task == "count" else "control (one object)")
    axes[0].legend(fontsize=6, ncol=2)
    return fig


def build_report(frame: pd.DataFrame, history: pd.DataFrame, params: Mapping[str, Any]) -> Report:
    table = summary_table(frame)
    ratio = float(params["report_ratio"])
    at = table[np.isclose(table.ratio, ratio)].sort_values(["task", "relative"], ascending=[True, False])
    full = history.groupby("seed")["test_accuracy_full"].last()
    shown = at[["task", "method", "k_fed", "relative", "relative_std", "coverage", "prune_ms"]].to_dict("records")
    for r in shown:
        for k in ("relative", "relative_std", "coverage", "prune_ms"):
            r[k] = fmt(r[k], 3)
    t1 = table1_frame()

    def cell(task: str, method: str, column: str) -> str:
        row = at[(at.task == task) & (at.method == method)]
        return fmt(float(row[column].iloc[0]), 3) if len(row) else "n/a"

    reading = (
        "The reader was trained on all 64 tokens. On the single-object control, where every answer is 'one', "
        f"random selection keeps relative accuracy {cell('control', 'random', 'relative')} and uniform pooling "
        f"{cell('control', 'uniform_pool', 'relative')}, while [CLS] Top-K keeps {cell('control', 'topk', 'relative')}"
        f" although it covers the object in {cell('control', 'topk', 'coverage')} of the scenes: when the kept tokens "
        "are mostly object tokens, the reader sees more objects than there are. Where these numbers say so, the "
        "stand-in counts by the share of object tokens, and saliency-based selection (SpecFlow included) breaks "
        "that cue at high pruning; the accuracy claims then compare methods near a floor, and object coverage "
        "is the cleaner test of the paper's mechanism."
    )
    sections = [
        ("Stand-in VLM",
         "Full-token test accuracy of the counting stand-in per seed: "
         + ", ".join(f"seed {s}: {v:.3f}" for s, v in full.items())
         + " (spec's sanity target on D2: >= 0.85)."),
        (f"All methods at {100 * ratio:.1f}% pruning (mean ± std over seeds)", markdown_table(shown)),
        ("Reading the counting numbers", reading),
        ("Table 1 arithmetic (acceptance check 5)",
         f"SpecFlow @64 recomputed from the per-benchmark numbers: {t1.recomputed[0]} (paper: 95.6). "
         "VisionZip's and ToMe's per-benchmark rows are not in the spec, so their averages (94.5, 70.1) are "
         "listed, not recomputed."),
    ]  # fmt: skip
    methods = list(params["methods"])
    return Report(
        title="SpecFlow: spectral heat flow for training-free visual token condensation",
        summary=(
            "Synthetic counting scenes (1-5 coloured objects, 8x8 = 64 patch tokens) read by a stand-in VLM: a tiny "
            "CLIP-vision encoder (transformers CLIPVisionModel), a linear projector and a 2-block causal reader, "
            "trained once per seed on full inputs. Every pruning method is training-free and applied to the frozen "
            "model at 66.7 / 77.8 / 88.9% pruning (K = 21 / 14 / 7). Relative accuracy = pruned / full-token "
            "accuracy of the same seed. SpecFlow feeds K + 2 tokens (two sinks); `specflow_matched` feeds K."
        ),
        table=metrics_table(frame, params["scale"]),
        sections=sections,
        figures=[
            Figure(
                "figure_retention",
                "Relative accuracy vs pruning ratio (mean ± std over seeds)",
                curves_figure(table, "relative", methods, "relative accuracy"),
            ),
            Figure(
                "figure_coverage",
                "Object coverage vs pruning ratio (selection methods)",
                curves_figure(table, "coverage", methods, "object coverage"),
            ),
        ],  # fmt: skip
        tables=[
            Table("table_relative", "Per task, method and ratio: relative accuracy, coverage (mean, std)", table),
            Table("table_table1", "Table 1 average at 64 tokens, recomputed", t1),
        ],
        limitations=[
            "Absolute benchmark numbers, language effects and the prefill/latency/FLOPs savings cannot be reproduced "
            "with a 64-token toy (spec section 7).",
            "The reader is a 2-block classifier, so FastV's analogue prunes after reader block 1 by the query's "
            "attention; PDrop, SparseVLM, DART and HoloV are not run.",
        ],
        metrics={
            "summary": table.astype(object).where(table.notna(), None).to_dict("records"),
            "table1_specflow_64": float(t1.recomputed[0]),
        },
    )
