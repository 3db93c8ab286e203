"""dualreform's claims, table, figures and report (spec sections 7 and 11).

Gated: G1 (pseudo references from refined responses beat those from raw responses by >= 10 points), G2
(DualReform's test MRR >= 0.90 x the reference-based upper bound's), G3 (DualReform's MRR above the raw query's
and the SFT-only model's in every seed), and the negative control of section 11 (random pseudo references do
not beat SFT-only). DualReform is judged at its last iteration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import frames, plots
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table
from paperflow.dualreform.pipeline import TEMPLATES

LABELS = {
    "raw": "raw query",
    "sft_human": "SFT-only (human rewrites)",
    "retpo": "reference-based (gold refs, RetPO-style)",
    "dualreform": "DualReform",
    "single_role": "single-role refinement",
    "random_ref": "random pseudo refs (control)",
}


def final_rows(evals: pd.DataFrame, iterations: int) -> pd.DataFrame:
    """One row per (method, seed): DualReform at its last iteration, the others at their only one."""
    last = np.where(evals["method"] == "dualreform", iterations, evals.groupby("method")["iteration"].transform("max"))
    return evals[evals["iteration"] == last]


def mrr(evals: pd.DataFrame, method: str, seeds: Sequence[int], iterations: int) -> list[float]:
    return frames.per_seed(final_rows(evals, iterations), seeds, value="mrr", method=method)


def ref_accuracy(refs: pd.DataFrame, seeds: Sequence[int], iteration: int) -> list[float]:
    hit = refs.assign(value=(refs["ref"] == refs["gold"]).astype(float))
    per = hit[hit["iteration"] == iteration].groupby("seed")["value"].mean()
    return [float(per.get(s, np.nan)) for s in seeds]


def raw_response_accuracy(table: pd.DataFrame) -> float:
    """Share of training turns whose raw response retrieves the gold passage first (no refinement)."""
    train = table[table["split"] == "train"]
    top = np.array([r[TEMPLATES.index("raw")] for r in train["r_top1"]])
    return float(np.mean(top == train["gold_pid"].to_numpy()))


def build_claims(
    evals: pd.DataFrame, dual_refs: pd.DataFrame, raw_acc: float, seeds: Sequence[int], iterations: int
) -> list[Claim]:
    """G1-G3 and the negative control, from the evaluations, DualReform's references and the raw-response
    pseudo-reference accuracy."""
    dual = mrr(evals, "dualreform", seeds, iterations)
    sft = mrr(evals, "sft_human", seeds, iterations)
    raw = mrr(evals, "raw", seeds, iterations)
    retpo = mrr(evals, "retpo", seeds, iterations)
    random_ref = mrr(evals, "random_ref", seeds, iterations)
    refined = ref_accuracy(dual_refs, seeds, iterations)
    claims = [
        compare_claim(
            id="g1_refined_refs_beat_raw_by_10pts",
            statement=f"G1: pseudo-reference accuracy on train turns with responses refined by the CQR model itself "
            f"(iteration {iterations}) exceeds the raw responses' by >= 10 points (mean of seeds)",
            values=[a - raw_acc for a in refined],
            threshold=0.10,
            comparison=">=",
            seeds=seeds,
            limitation="SynthConvQA's responses omit the entity by construction (spec section 9): raw-response "
            f"accuracy is {raw_acc:.3f}, so part of G1 is built into the generator",
        ),
        compare_claim(
            id="g2_dualreform_ge_90pct_of_reference_based",
            statement="G2: DualReform's test MRR is >= 0.90 x the reference-based (gold pseudo refs) model's "
            "(mean of per-seed ratios)",
            values=[d / r for d, r in zip(dual, retpo)],
            threshold=0.90,
            comparison=">=",
            seeds=seeds,
            paper_value="96.9-99.1% of the reference-based model (abstract)",
        ),
        compare_claim(
            id="g3_dualreform_gt_raw_every_seed",
            statement="G3: DualReform's test MRR exceeds the raw query's in every seed (worst seed's margin > 0)",
            values=[d - r for d, r in zip(dual, raw)],
            threshold=0.0,
            comparison=">",
            seeds=seeds,
            aggregate="min",
        ),
        compare_claim(
            id="g3_dualreform_gt_sft_every_seed",
            statement="G3: DualReform's test MRR exceeds the SFT-only (human-template) model's in every seed "
            "(worst seed's margin > 0)",
            values=[d - s for d, s in zip(dual, sft)],
            threshold=0.0,
            comparison=">",
            seeds=seeds,
            aggregate="min",
        ),
        compare_claim(
            id="control_random_refs_do_not_beat_sft",
            statement="Negative control: with random pseudo references the test MRR does not beat SFT-only "
            "(mean of seeds)",
            values=random_ref,
            threshold_values=sft,
            comparison="<=",
            seeds=seeds,
        ),
    ]
    if iterations > 1:
        claims.append(
            compare_claim(
                id="refs_iteration_last_ge_first",
                statement=f"Reported: pseudo-reference accuracy at iteration {iterations} >= iteration 1 "
                "(spec 10.6 asks for 2 of 3 seeds; mean shown)",
                values=refined,
                threshold_values=ref_accuracy(dual_refs, seeds, 1),
                comparison=">=",
                seeds=seeds,
                gated=False,
            )
        )
    return claims


def retrieval_table(evals: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds of each metric per method and iteration."""
    long = evals.melt(
        id_vars=["method", "seed", "iteration"], value_vars=["mrr", "ndcg@3", "recall@10", "recall@100"]
    ).rename(columns={"variable": "metric"})
    return frames.seed_summary(long, ["method", "iteration", "metric"])


def figure_mrr(evals: pd.DataFrame, methods: Sequence[str], iterations: int):
    fig, (ax,) = plots.subplots(1, width=7.5)
    fin = final_rows(evals, iterations)
    for i, m in enumerate(methods):
        vals = fin[fin["method"] == m]["mrr"].to_numpy()
        ax.bar(i, vals.mean(), color="tab:red" if m == "dualreform" else "tab:gray", alpha=0.7)
        ax.scatter(np.full(len(vals), i), vals, color="black", s=12, zorder=3)
    ax.set_xticks(range(len(methods)), [LABELS[m] for m in methods], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("test MRR (BM25)")
    ax.set_ylim(0, 1)
    ax.set_title("Test MRR per method (bars: mean, dots: seeds)")
    return fig


def figure_refs(refs: Mapping[str, pd.DataFrame], raw_acc: float):
    fig, (ax,) = plots.subplots(1, width=6.0)
    for m, frame in refs.items():
        acc = frame.assign(hit=(frame["ref"] == frame["gold"]).astype(float)).groupby(["iteration", "seed"])["hit"]
        per = acc.mean().groupby("iteration")
        ax.errorbar(per.mean().index, per.mean(), yerr=per.std().fillna(0), marker="o", capsize=3, label=LABELS[m])
    ax.axhline(raw_acc, color="black", linestyle="--", label="raw responses")
    ax.set_xlabel("iteration")
    ax.set_ylabel("pseudo-reference accuracy (train turns)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    return fig


def build_report(
    evals: pd.DataFrame,
    histories: Mapping[str, pd.DataFrame],
    refs: Mapping[str, pd.DataFrame],
    table: pd.DataFrame,
    params: Mapping[str, Any],
) -> Report:
    seeds, methods, iterations = list(params["seeds"]), list(params["methods"]), int(params["iterations"])
    raw_acc = raw_response_accuracy(table)
    claims = build_claims(evals, refs["dualreform"], raw_acc, seeds, iterations)
    summary_rows = retrieval_table(evals)
    mrr_rows = summary_rows[summary_rows["metric"] == "mrr"]
    lines = [
        {
            "method": LABELS[r.method],
            "iteration": int(r.iteration),
            "MRR": f"{r.mean:.3f} ± {0 if np.isnan(r.std) else r.std:.3f}",
            "seeds": int(r.n_seeds),
        }
        for r in mrr_rows.itertuples()
    ]
    dpo = {
        m: float(h[h["phase"].str.endswith("dpo")].groupby(["seed", "iteration"])["reward_accuracy"].last().mean())
        for m, h in histories.items()
        if "reward_accuracy" in h
    }
    sections = [
        ("Test retrieval (MRR, mean ± std over seeds)", markdown_table(lines)),
        (
            "Pseudo references",
            f"Raw responses retrieve the gold passage first for {raw_acc:.3f} of the training turns. "
            + "; ".join(
                f"{LABELS[m]}: "
                + ", ".join(
                    f"it{it} {np.nanmean(ref_accuracy(r, seeds, it)):.3f}" for it in sorted(set(r["iteration"]))
                )
                for m, r in refs.items()
            )
            + ". DPO reward accuracy at the end of training (mean over seeds and rounds): "
            + ", ".join(f"{LABELS[m]} {v:.2f}" for m, v in dpo.items())
            + ".",
        ),
    ]
    return Report(
        title="DualReform: reference-free preference optimisation for conversational query reformulation",
        summary="A tiny Qwen2 CQR model on SynthConvQA ranks six teacher rewrites of each test query; BM25 retrieves "
        "with the chosen one. Every trained method starts from the same SFT model (human-template rewrites).",
        claims=claims,
        sections=sections,
        figures=[
            Figure("figure_mrr", "Test MRR per method", figure_mrr(evals, methods, iterations)),
            Figure("figure_refs", "Pseudo-reference accuracy per iteration", figure_refs(refs, raw_acc)),
        ],
        tables=[Table("table_retrieval", "Retrieval metrics per method and iteration", summary_rows)],
        limitations=[
            "Candidates come from six deterministic templates, not an LLM; inference reranks them (spec section 7, "
            "inference (a)); greedy generation is not run.",
            "TopiOCQA, GTR dense retrieval and a pretrained LM with LoRA run at `scale=paper` (workflows/dualreform/"
            "README.md, Paper scale); QReCC and the 8B backbone are not wired.",
        ],
        metrics={"raw_response_ref_accuracy": raw_acc},
    )
