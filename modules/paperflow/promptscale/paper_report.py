"""PromptScale's report at paper scale: the EM curve (held-out importance-weighted bound per iteration, the kept
and best rewards of the E-steps), the synthesised problems of the cold-start and EM prompt models, and the policy's
benchmark accuracy beside the paper's number for that row. One run (no seeds at this scale), so every direction is
reported, not gated (the claims of config/promptscale.yaml with scales [paper]).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from paperflow.core.claims import long_table
from paperflow.core.report import Figure, Report, Table, markdown_table

# Qwen3-4B-Thinking-2507 before self-play, the first row of the paper's 4B table (spec 5, from the HF model card)
PAPER_BASE_4B = {"aime24": 85.2, "aime25": 81.3, "hmmt_feb25": 55.5, "lcb_v5": 63.8, "lcb_v6": 55.2}
# PromptCoT-2.0-SelfPlay-4B, the last row of the same table (spec 5)
PAPER_SELFPLAY_4B = {"aime24": 87.3, "aime25": 85.0, "hmmt_feb25": 66.5, "lcb_v5": 67.7, "lcb_v6": 61.1}
# PromptCoT-2.0-SFT-7B (Qwen2.5-7B-Instruct on the synthetic prompts only; spec 5, HMMT and LCB v6 not retrieved)
PAPER_SFT_7B = {"aime24": 73.1, "aime25": 65.6, "lcb_v5": 53.4}
PAPER_ROWS = {"base": PAPER_BASE_4B, "selfplay": PAPER_SELFPLAY_4B, "sft": PAPER_SFT_7B}


def metrics_table(curve: pd.DataFrame, synthesis: pd.DataFrame, evals: pd.DataFrame, scale: str) -> pd.DataFrame:
    """The long metrics table of the one paper-scale run (seed 0): EM's held-out bound gain from the cold start to
    the last iteration (method `em`), each prompt model's synthesis validity (`heldout_validity`), and each policy's avg@k per benchmark
    (metric `<benchmark>/avg_at_k`)."""
    rows = [
        {
            "seed": 0,
            "method": "em",
            "metric": "heldout_bound_gain",
            "value": float(curve["heldout_bound"].iloc[-1] - curve["heldout_bound"].iloc[0]),
        }
    ]
    rows += [
        {"seed": 0, "method": r["variant"], "metric": "heldout_validity", "value": float(r["validity"])}
        for r in synthesis.to_dict("records")
    ]
    rows += [
        {"seed": 0, "method": r["policy"], "metric": f"{r['benchmark']}/avg_at_k", "value": float(r["avg_at_k"])}
        for r in evals.to_dict("records")
    ]
    return long_table(rows, scale)


def benchmark_table(evals: pd.DataFrame) -> pd.DataFrame:
    table = evals.copy()
    table["paper_base_4b"] = [
        PAPER_BASE_4B.get(b, math.nan) if p == "base" else math.nan for p, b in zip(table["policy"], table["benchmark"])
    ]
    table["paper"] = [PAPER_ROWS.get(p, {}).get(b, math.nan) for p, b in zip(table["policy"], table["benchmark"])]
    return table


def code_selfplay_sections(selfplay: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """One row of the code self-play (code_selfplay.smk's summaries), when it ran: code problems, those that kept
    their generated tests, the tests, the rollouts, their pass rate in the sandbox, the problems paired, the pairs."""
    if "code_tests" not in selfplay:
        return []
    tests, rollouts = selfplay["code_tests"], selfplay["code_rollouts"]
    verify, pairs = selfplay["code_verify"], selfplay["code_pairs"]
    row = {
        "code_problems": tests["problems"],
        "problems_with_tests": tests["problems_with_tests"],
        "tests": tests["tests_used"],
        "inputs_conflicting": tests["inputs_conflicting"],
        "rollouts": rollouts["completions"],
        "pass_rate": verify["pass_rate"],
        "problems_solved": verify["problems_solved"],
        "problems_paired": pairs["problems_paired"],
        "pairs": pairs["pairs"],
    }
    return [("Code self-play (unit tests by the tester, programs run in the sandbox)", markdown_table([row]))]


def selfplay_limitation(selfplay: Mapping[str, Mapping[str, Any]]) -> str:
    if "code_tests" not in selfplay:
        return "Self-play is on math problems only, verified by the majority answer of the rollouts"
    return (
        "Self-play on math is verified by the majority answer of the rollouts, on code by unit tests that the tester "
        "wrote (prompt and test format ours; the tests are not checked against a reference solution)"
    )


def codeforces_sections(docs: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The Codeforces row of each policy (paperflow.promptscale.codeforces.report_rows): the CodeElo-style Elo from
    the judge's verdicts, or the key to set, beside the paper's Elo."""
    from paperflow.promptscale.codeforces import report_rows

    if not docs:
        return []
    return [("Codeforces (CodeElo-style Elo from the live judge's verdicts)", markdown_table(report_rows(docs)))]


def figure_em(curve: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4))
    axes[0].plot(curve["iteration"], curve["heldout_bound"], marker="o")
    axes[0].set_xlabel("EM iteration")
    axes[0].set_ylabel("held-out bound (nats / problem)")
    trained = curve.dropna(subset=["kept_reward"])
    axes[1].plot(trained["iteration"], trained["kept_reward"], marker="o", label="kept z")
    axes[1].plot(trained["iteration"], trained["best_reward"], marker="x", label="best of K")
    axes[1].set_xlabel("E-step on the models of iteration")
    axes[1].set_ylabel("R = log p(z, x | c), training seeds")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def build_report(
    curve: Sequence[Mapping[str, Any]],
    synthesis: Sequence[Mapping[str, Any]],
    evals: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    selfplay: Mapping[str, Mapping[str, Any]] | None = None,
    codeforces: Mapping[str, Mapping[str, Any]] | None = None,
) -> Report:
    curve = pd.DataFrame(curve).sort_values("iteration").reset_index(drop=True)
    synthesis, evals = pd.DataFrame(synthesis), pd.DataFrame(evals)
    table = benchmark_table(evals)
    models = params["models"]
    return Report(
        title=f"PromptScale at paper scale: {models['prompt']['hub']} as q and p, {models['policy']['hub']} evaluated",
        summary=f"EM over rationales ({params['llm_em']['iterations']} iterations, K = {params['llm_em']['k']}, "
        f"select {params['llm_em']['select']}) from PromptCoT 1.0's triples as the cold start; synthesis from p_0 and "
        f"p_E with vLLM; avg@{params['llm_eval']['samples']} boxed-answer accuracy on "
        f"{', '.join(params['benchmarks'])}.",
        table=metrics_table(curve, synthesis, evals, params["scale"]),
        sections=[
            ("EM curve", markdown_table(curve.to_dict("records"))),
            ("Synthesised problems", markdown_table(synthesis.to_dict("records"))),
            *[(f"Self-play {stage}", markdown_table([doc])) for stage, doc in (selfplay or {}).items()],
            *code_selfplay_sections(selfplay or {}),
            ("Benchmarks (avg@k, percent)", markdown_table(table.to_dict("records"))),
            *codeforces_sections(codeforces or {}),
        ],
        figures=[Figure("figure_em", "Held-out bound and E-step rewards per EM iteration", figure_em(curve))],
        tables=[
            Table("table_em", "EM curve", curve),
            Table("table_synthesis", "Synthesised problems per prompt model", synthesis),
            Table("table_benchmarks", "Benchmark accuracy per policy", table),
        ],
        limitations=[
            "The cold start uses PromptCoT 1.0's released triples, not 2.0's annotation by four instruct models; the "
            "E-step reward is the spec's recalled one; concept sets come from held-out seeds, not 1.0's sampler.",
            f"{selfplay_limitation(selfplay or {})}; the SFT arm trains "
            "on the released traces (not distilled again); the Codeforces Elo needs the live judge's verdicts of the submissions (codeforces.verdicts).",
        ],
        metrics={"benchmarks": list(params["benchmarks"])},
    )
