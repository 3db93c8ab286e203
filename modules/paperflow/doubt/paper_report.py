"""DOUBT's report at paper scale: per (MLLM, benchmark) each detector's AUROC (positive = ans0 wrong) and detection
accuracy at the official threshold (DOUBT trustworthy iff score > 0.48; entropy flags U >= 1.0), at n = n_max
under the code's labels (official) and the fixed ones (strict), and the spread over sub-samplings below n_max. The
paper's tables were not available (spec section 5), so nothing is compared with a paper number and no claim is
gated: the reported claim of config/doubt.yaml, DOUBT's AUROC above chance, is judged on `metrics_table` pooled over
the (MLLM, benchmark) pairs (bootstrap over seeds, then pairs). numpy, pandas and matplotlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from paperflow.core.claims import long_table
from paperflow.core.report import Figure, Report, Table, markdown_table
from paperflow.doubt.methods import METHODS, TRUST_THRESHOLD
from paperflow.doubt.vl_uncertainty import DESCRIPTION as VLU_DESCRIPTION
from paperflow.doubt.vl_uncertainty import METHOD as VLU_METHOD

# paper scale: semantic entropy's clusters come from the NLI entailment judge (`entailment`), not MiniLM cosine
PAPER_DESCRIPTIONS = {
    "se_plain": "semantic entropy, bidirectional-entailment clusters (NLI model), plain set",
    "se_oub": "semantic entropy, bidirectional-entailment clusters (NLI model), OUB set",
    "oub_se": "OUB + SE: mean of the two sets' entailment-clustered semantic entropies",
    VLU_METHOD: VLU_DESCRIPTION,
}


def full_sets(frame: pd.DataFrame, n_max: int) -> pd.DataFrame:
    """The rows of each method's whole answer set: n = n_max, VL-Uncertainty's n = its number of perturbed
    prompts (older metrics without `full_set`: n = n_max)."""
    if "full_set" in frame.columns:
        return frame[frame["full_set"].astype(bool)]
    return frame[frame["n"] == n_max]


def metrics_table(frame: pd.DataFrame, params: Mapping[str, Any]) -> pd.DataFrame:
    """The long metrics table the paper-scale claims of config/doubt.yaml are judged on: each detector's AUROC on its
    whole set under the official labels (`auroc_official/full_set`), per seed, one unit per (MLLM, benchmark)."""
    full = full_sets(frame, int(params["sampling"]["n_max"]))
    full = full[full["label_mode"] == "official"]
    rows = [
        {
            "seed": int(r.seed),
            "unit": f"{r.vlm}/{r.benchmark}",
            "method": r.method,
            "metric": "auroc_official/full_set",
            "value": float(r.auroc),
        }
        for r in full.itertuples()
    ]
    return long_table(rows, params["scale"])


def figure_auroc(frame: pd.DataFrame, n_max: int):
    full = full_sets(frame, n_max)
    full = full[full["label_mode"] == "official"]
    pivot = full.pivot_table(index=["vlm", "benchmark"], columns="method", values="auroc")
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(pivot)), 3.5))
    x = np.arange(len(pivot))
    width = 0.8 / max(1, len(pivot.columns))
    for k, m in enumerate(pivot.columns):
        ax.bar(x + k * width, pivot[m].to_numpy(), width, label=m)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xticks(x + 0.4 - width / 2, [f"{v}\n{b}" for v, b in pivot.index], fontsize=7)
    ax.set_ylabel(f"AUROC, whole set (n = {n_max}; VL-Uncertainty: its prompts)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    return fig


def build_report(frame: pd.DataFrame, params: Mapping[str, Any]) -> Report:
    n_max = int(params["sampling"]["n_max"])
    full = full_sets(frame, n_max)
    cells = [
        {k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()}
        for r in full.drop(columns=["auroc_std_subsamples", "full_set"], errors="ignore").to_dict("records")
    ]
    below = frame.drop(full.index)
    stability = [
        {k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()}
        for r in below[below["label_mode"] == "official"][
            ["vlm", "benchmark", "method", "n", "auroc", "auroc_std_subsamples"]
        ].to_dict("records")
    ]
    methods = sorted(set(frame["method"]))
    return Report(
        title="DOUBT at paper scale: hallucination detection on MLLM benchmarks",
        summary="For every (MLLM, benchmark) pair the MLLM answers each question once (ans0, whose correctness is "
        "the label), samples a plain answer set and, after listing up to three objects in the image, an object-first "
        f"set (n = {n_max} each); the detectors score the sets' sentence embeddings without the ground truth. "
        f"DOUBT flags an answer as a hallucination when 0.5 Rbar(A) + 0.5 Rbar(B) <= {TRUST_THRESHOLD}.",
        table=metrics_table(frame, params),
        sections=[
            (
                f"Detectors on their whole sets (n = {n_max}; VL-Uncertainty: one answer per perturbed prompt)",
                markdown_table(cells)
                + "\n\nMethods: "
                + "; ".join(
                    f"`{m}`: {PAPER_DESCRIPTIONS[m] if m in PAPER_DESCRIPTIONS else METHODS[m].description}"
                    for m in methods
                )
                + ". `official` labels follow the code (a multiple-choice answer is right when the gt index occurs "
                "in it; a judge reply holding 'C' or 'c' is 'correct'); `strict` ones parse the first digit / the "
                "reply's first word.",
            ),
            ("Spread over random sub-samplings below n_max (official labels)", markdown_table(stability)),
        ],
        figures=[
            Figure("figure_auroc", "AUROC per detector on its whole set (official labels)", figure_auroc(frame, n_max))
        ],
        tables=[Table("table_detectors", "Per (MLLM, benchmark, method, n, label mode): AUROC, accuracy", frame)],
        limitations=[
            "The paper's table numbers were not available (spec section 5): no paper value is compared.",
            "VL-Uncertainty's free-form clusters come from the NLI entailment judge, not its Yes/No LLM prompts; its "
            "rephrasings are made once per benchmark and seed and shared by every MLLM. Semantic entropy "
            "clusters by an NLI model's bidirectional entailment (Kuhn et al.), not by the code's Yes/No LLM "
            "prompts, and is the discrete variant (no likelihoods); `se_exact` is the entropy over exact embedded "
            "strings (for multiple choice: over the chosen options, each unparsable answer its own cluster where "
            "the code's SE pools them into one).",
        ],
        metrics={"summary": frame.astype(object).where(frame.notna(), None).to_dict("records")},
    )
