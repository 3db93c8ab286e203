"""dualreform's paper-scale claims, table and figure (TopiOCQA, BM25): the spec's G1-G3 and the negative control of
section 11 with the pretrained instruct model ("prompted", the model every trained method starts from) in the SFT-only
model's place, since TopiOCQA has no human rewrites. Reported against the spec's thresholds, not gated: the gates
are the smoke scale's; the paper's own numbers are in the statements where known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import frames, plots
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table
from paperflow.dualreform.claims import final_rows, mrr, raw_response_accuracy, ref_accuracy

LABELS = {
    "raw": "raw question",
    "prompted": "pretrained instruct model (zero-shot ranking)",
    "retpo": "reference-based (gold refs, RetPO-style)",
    "dualreform": "DualReform",
    "single_role": "single-role refinement (+ current question)",
    "random_ref": "random pseudo refs (control)",
}


def build_claims(
    evals: pd.DataFrame, dual_refs: pd.DataFrame, raw_acc: float, seeds: Sequence[int], iterations: int
) -> list[Claim]:
    dual, retpo = mrr(evals, "dualreform", seeds, iterations), mrr(evals, "retpo", seeds, iterations)
    raw, prompted = mrr(evals, "raw", seeds, iterations), mrr(evals, "prompted", seeds, iterations)
    random_ref = mrr(evals, "random_ref", seeds, iterations)
    refined = ref_accuracy(dual_refs, seeds, iterations)
    return [
        compare_claim(
            id="paper_g1_refined_refs_beat_raw_by_10pts",
            statement=f"G1 (TopiOCQA): pseudo-reference accuracy on train turns with responses refined by the CQR model "
            f"itself (iteration {iterations}) exceeds the raw responses' by >= 10 points",
            values=[a - raw_acc for a in refined],
            threshold=0.10,
            comparison=">=",
            seeds=seeds,
            gated=False,
        ),
        compare_claim(
            id="paper_g2_dualreform_ge_90pct_of_reference_based",
            statement="G2 (TopiOCQA, BM25): DualReform's test MRR is >= 0.90 x the reference-based model's",
            values=[d / r if r else float("nan") for d, r in zip(dual, retpo)],
            threshold=0.90,
            comparison=">=",
            seeds=seeds,
            gated=False,
            paper_value="96.9-99.1% of the reference-based model (abstract)",
        ),
        compare_claim(
            id="paper_g3_dualreform_gt_raw_every_seed",
            statement="G3 (TopiOCQA, BM25): DualReform's test MRR exceeds the raw question's in every seed",
            values=[d - r for d, r in zip(dual, raw)],
            threshold=0.0,
            comparison=">",
            seeds=seeds,
            aggregate="min",
            gated=False,
        ),
        compare_claim(
            id="paper_g3_dualreform_gt_prompted_every_seed",
            statement="G3 (TopiOCQA, BM25): DualReform's test MRR exceeds the pretrained instruct model's zero-shot "
            "ranking (the LLM-based baseline) in every seed",
            values=[d - p for d, p in zip(dual, prompted)],
            threshold=0.0,
            comparison=">",
            seeds=seeds,
            aggregate="min",
            gated=False,
        ),
        compare_claim(
            id="paper_control_random_refs_do_not_beat_prompted",
            statement="Negative control (TopiOCQA): with random pseudo references the test MRR does not beat the "
            "pretrained model it starts from",
            values=random_ref,
            threshold_values=prompted,
            comparison="<=",
            seeds=seeds,
            gated=False,
        ),
    ]


METRICS = ("mrr", "ndcg@3", "recall@10", "recall@100")


def retrieval_table(evals: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds of each metric per method and iteration: BM25's, and the dense retriever's
    ("dense_" + metric) where the evaluation ran it."""
    present = [m for m in (*METRICS, *(f"dense_{m}" for m in METRICS)) if m in evals]
    long = evals.melt(id_vars=["method", "seed", "iteration"], value_vars=present).rename(
        columns={"variable": "metric"}
    )
    return frames.seed_summary(long, ["method", "iteration", "metric"])


def figure_mrr(evals: pd.DataFrame, methods: Sequence[str], iterations: int):
    fig, (ax,) = plots.subplots(1, width=7.5)
    fin = final_rows(evals, iterations)
    for i, m in enumerate(methods):
        vals = fin[fin["method"] == m]["mrr"].to_numpy()
        ax.bar(i, vals.mean() if len(vals) else 0.0, color="tab:red" if m == "dualreform" else "tab:gray", alpha=0.7)
        ax.scatter(np.full(len(vals), i), vals, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(methods)), [LABELS[m] for m in methods], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("test MRR (BM25, TopiOCQA dev)")
    ax.set_title("Test MRR per method (bars: mean, dots: seeds)")
    return fig


def build_report(
    evals: pd.DataFrame, refs: Mapping[str, pd.DataFrame], table: pd.DataFrame, params: Mapping[str, Any]
) -> Report:
    seeds, methods, iterations = list(params["seeds"]), list(params["methods"]), int(params["iterations"])
    raw_acc = raw_response_accuracy(table)
    claims = build_claims(evals, refs["dualreform"], raw_acc, seeds, iterations)
    summary = retrieval_table(evals)
    lines = [
        {
            "method": LABELS[r.method],
            "iteration": int(r.iteration),
            "metric": r.metric,
            "mean ± std": f"{r.mean:.4f} ± {0 if np.isnan(r.std) else r.std:.4f}",
            "seeds": int(r.n_seeds),
        }
        for r in summary.itertuples()
    ]
    refs_text = "; ".join(
        f"{LABELS[m]}: "
        + ", ".join(f"it{it} {np.nanmean(ref_accuracy(r, seeds, it)):.3f}" for it in sorted(set(r["iteration"])))
        for m, r in refs.items()
    )
    pretrained = params["pretrained"]
    return Report(
        title="DualReform at paper scale: TopiOCQA, BM25, a pretrained instruct model with LoRA (TRL SFT + DPO)",
        summary=f"{pretrained['hub']} at {pretrained.get('revision') or 'the locked commit'} with LoRA ranks six "
        "history-template rewrites of each TopiOCQA dev question; bm25s retrieves from the 25.7M-passage corpus.",
        claims=claims,
        sections=[
            ("Test retrieval (mean ± std over seeds)", markdown_table(lines)),
            (
                "Pseudo references",
                f"Raw responses retrieve the gold passage first for {raw_acc:.3f} of the training turns. {refs_text}.",
            ),
        ],
        figures=[Figure("figure_mrr", "Test MRR per method", figure_mrr(evals, methods, iterations))],
        tables=[Table("table_retrieval", "Retrieval metrics per method and iteration", summary)],
        limitations=[
            "Candidates come from six history templates, not GPT-3.5 / Llama-3.1 rewrites and expansions; inference "
            "ranks them by the model's length-normalised log-probability (spec section 7, inference (a)).",
            "Training preferences use BM25 ranks; the dense retriever (metrics prefixed dense_) only evaluates. "
            "QReCC is not wired.",
        ],
        metrics={"raw_response_ref_accuracy": raw_acc},
    )
