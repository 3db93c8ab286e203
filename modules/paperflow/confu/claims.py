"""ConFu's claims, tables and figures from the evaluation frames (spec sections 5, 7, 8, 10 and 11)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.report import (
    Claim,
    Figure,
    Report,
    Table,
    compare_claim,
    fmt,
    markdown_table,
    mean_std_text,
    statistic_claim,
)

PAPER_RATIO = "tau ConFu / EAGLE-3 = 1.08-1.13 at T = 0, 30 nodes (Llama-3.2-3B and 3.1-8B; spec section 5)"


def tau(frame: pd.DataFrame) -> float:
    """Mean acceptance length: tokens generated after the prefill over target verification forwards (section 8)."""
    cycles = frame.cycles.sum()
    return float(frame.new_after_prefill.sum() / cycles) if cycles else float("nan")


def select(frame: pd.DataFrame, variant: str, temperature: float, seed: int | None = None) -> pd.DataFrame:
    sel = (frame.variant == variant) & np.isclose(frame.temperature, temperature)
    if seed is not None:
        sel &= frame.seed == seed
    return frame[sel]


def per_seed_tau(frame, variant, temperature, seeds) -> list[float]:
    return [tau(select(frame, variant, temperature, s)) for s in seeds]


def depth_acceptance(accepted: Sequence[Sequence[int]], depth: int) -> list[float]:
    """P(the draft token at depth i is accepted | its parent was), i = 1..depth, from accepted depths per cycle."""
    acc = np.concatenate([np.asarray(a, dtype=int) for a in accepted]) if len(accepted) else np.zeros(0, int)
    out = []
    for i in range(1, depth + 1):
        reached = (acc >= i - 1).sum()
        out.append(float((acc >= i).sum() / reached) if reached else float("nan"))
    return out


def ratio_ci(a: pd.DataFrame, b: pd.DataFrame, n_boot: int, level: float, seed: int = 0) -> tuple[float, float, float]:
    """tau(a) / tau(b) and its paired bootstrap interval over (seed, prompt) units (the same prompts decoded by
    both), resampling units with replacement."""
    key = ["seed", "row"]
    m = a.set_index(key)[["new_after_prefill", "cycles"]].join(
        b.set_index(key)[["new_after_prefill", "cycles"]], lsuffix="_a", rsuffix="_b", how="inner"
    )
    arr = m.to_numpy(dtype=float)
    point = (arr[:, 0].sum() / arr[:, 1].sum()) / (arr[:, 2].sum() / arr[:, 3].sum())
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(arr), size=(n_boot, len(arr)))
    s = arr[idx].sum(1)
    ratios = (s[:, 0] / s[:, 1]) / (s[:, 2] / s[:, 3])
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(point), float(lo), float(hi)


def claims(frame: pd.DataFrame, params: Mapping[str, Any]) -> list[Claim]:
    seeds = list(params["seeds"])
    cl = params["claims"]
    depth = int(params["decoding"]["depth"])
    margin, n_boot, level = float(cl["margin"]), int(cl["bootstrap"]), float(cl["level"])
    pct = f"{100 * level:.0f}%"
    gated = ("vanilla", "eagle3", "eagle3_extra", "confu")
    out = []
    # (a) lossless at T = 0, every method; the leaking verifier as its control
    worst = [min(float(select(frame, v, 0.0, s).lossless.mean()) for v in gated) for s in seeds]
    out.append(compare_claim(
        id="a_lossless_greedy",
        statement="(a) T = 0: every method's output equals the target's greedy decoding on every test prompt "
        "(share of prompts, worst method per seed)",
        values=worst, seeds=seeds, comparison=">=", threshold=1.0, aggregate="min",
        paper_value="lossless by construction (section 2)",
    ))  # fmt: skip
    leak = [float(select(frame, "confu_leak", 0.0, s).lossless.mean()) for s in seeds]
    out.append(compare_claim(
        id="a_control_leaking_mask",
        statement="(a) control: with a mask that lets regular tokens see the soft prompts and contemplate tokens, "
        "ConFu's output is NOT the target's greedy decoding on every prompt (share lossless, best seed, < 1)",
        values=leak, seeds=seeds, comparison="<", threshold=1.0, aggregate="max",
    ))  # fmt: skip
    # (b) EAGLE-3 beats the vanilla draft; with the features shuffled across prompts it must not
    van = per_seed_tau(frame, "vanilla", 0.0, seeds)
    e3 = per_seed_tau(frame, "eagle3", 0.0, seeds)
    shuf = per_seed_tau(frame, "eagle3_features_shuffled", 0.0, seeds)
    out.append(compare_claim(
        id="b_eagle3_vs_vanilla",
        statement=f"(b) T = 0: tau(EAGLE-3) / tau(vanilla one-layer draft) >= {margin} (mean over seeds)",
        values=list(np.divide(e3, van)), seeds=seeds, comparison=">=", threshold=margin,
        paper_value="EAGLE-3 > feature-free drafts (section 3, context)",
    ))  # fmt: skip
    out.append(compare_claim(
        id="b_control_shuffled_features",
        statement=f"(b) control: EAGLE-3 reading another prompt's target features: tau / tau(vanilla) < {margin}",
        values=list(np.divide(shuf, van)), seeds=seeds, comparison="<", threshold=margin,
    ))  # fmt: skip
    # (c) ConFu vs EAGLE-3 trained for the same extra steps; f shuffled across prompts as the control
    base = select(frame, "eagle3_extra", 0.0)
    point, lo, hi = ratio_ci(select(frame, "confu", 0.0), base, n_boot, level)
    per = list(np.divide(per_seed_tau(frame, "confu", 0.0, seeds), per_seed_tau(frame, "eagle3_extra", 0.0, seeds)))
    out.append(statistic_claim(
        id="c_confu_vs_eagle3_extra",
        statement=f"(c) T = 0: tau(ConFu) / tau(EAGLE-3 + the same extra steps) = {point:.4f}, {pct} CI "
        f"[{lo:.4f}, {hi:.4f}]: the interval lies above 1",
        value=lo, label=f"{pct} CI low, paired bootstrap", values=per, seeds=seeds, comparison=">", threshold=1.0,
        paper_value=PAPER_RATIO,
    ))  # fmt: skip
    p2, lo2, hi2 = ratio_ci(select(frame, "confu_f_shuffled", 0.0), base, n_boot, level)
    per2 = list(
        np.divide(per_seed_tau(frame, "confu_f_shuffled", 0.0, seeds), per_seed_tau(frame, "eagle3_extra", 0.0, seeds))
    )
    out.append(statistic_claim(
        id="c_control_shuffled_f",
        statement=f"(c) control (section 11): ConFu with f shuffled across prompts: ratio {p2:.4f}, {pct} CI "
        f"[{lo2:.4f}, {hi2:.4f}] includes 1 (statistic: how far 1 lies outside, max(lo - 1, 1 - hi) <= 0)",
        value=max(lo2 - 1.0, 1.0 - hi2), label="distance of 1 outside the CI", values=per2, seeds=seeds,
        comparison="<=", threshold=0.0,
    ))  # fmt: skip
    # report-only: the depth profile, the other temperatures, and the calibration of section 11
    deep = lambda v, s: depth_acceptance(select(frame, v, 0.0, s).accepted.tolist(), depth)[-1]  # noqa: E731
    out.append(compare_claim(
        id="c_depth_profile",
        statement=f"(c) T = 0: ConFu's acceptance at depth {depth} (given its parent) > EAGLE-3 + extra steps'",
        values=[deep("confu", s) for s in seeds], threshold_values=[deep("eagle3_extra", s) for s in seeds],
        seeds=seeds, comparison=">", gated=False,
    ))  # fmt: skip
    for temp in params["decoding"]["temperatures"]:
        if float(temp) == 0.0:
            continue
        vals = list(np.divide(per_seed_tau(frame, "confu", float(temp), seeds),
                              per_seed_tau(frame, "eagle3_extra", float(temp), seeds)))  # fmt: skip
        out.append(compare_claim(
            id=f"c_ratio_T{temp}",
            statement=f"T = {temp}: tau(ConFu) / tau(EAGLE-3 + extra steps) >= 1 (mean over seeds)",
            values=vals, seeds=seeds, comparison=">=", threshold=1.0, gated=False,
            paper_value="gains consistent over T in {0, 0.7, 1} (abstract)",
        ))  # fmt: skip
    lo_c, hi_c = (float(x) for x in cl["calibration"])
    cal = [deep("eagle3", s) for s in seeds]
    out.append(compare_claim(
        id="calibration_eagle3_depth",
        statement=f"section 11 calibration: EAGLE-3's acceptance at depth {depth} lies in [{lo_c}, {hi_c}] (mean; "
        f"checked against the upper end here, the lower end in the table)",
        values=cal, seeds=seeds, comparison="<=", threshold=hi_c, gated=False,
    ))  # fmt: skip
    return out


def tau_table(frame: pd.DataFrame, depth: int) -> pd.DataFrame:
    rows = []
    for (variant, temp, seed), g in frame.groupby(["variant", "temperature", "seed"]):
        acc = depth_acceptance(g.accepted.tolist(), depth)
        c = float(g.c_draft.iloc[0]) if "c_draft" in g else float("nan")
        t = tau(g)
        rows.append({
            "variant": variant, "temperature": temp, "seed": seed, "tau": t,
            "accepted_per_cycle": float(np.mean(np.concatenate([np.asarray(a) for a in g.accepted]))),
            "lossless": float(g.lossless.mean()), "c_draft": c, "sr_sim": t / (1 + depth * c),
            **{f"acc_depth{i + 1}": a for i, a in enumerate(acc)},
            **{f"tau_{task}": tau(gt) for task, gt in g.groupby("task")},
        })  # fmt: skip
    return pd.DataFrame(rows)


def tau_figure(table: pd.DataFrame, variants: Sequence[str], temperatures: Sequence[float]):
    from paperflow.core import plots

    fig, axes = plots.subplots(len(temperatures), width=4.5, height=3.5)
    axes = np.atleast_1d(axes)
    for ax, temp in zip(axes, temperatures):
        sub = table[np.isclose(table.temperature, temp)]
        shown = [v for v in variants if v in set(sub.variant)]
        means = [sub[sub.variant == v].tau.mean() for v in shown]
        stds = [sub[sub.variant == v].tau.std(ddof=1) for v in shown]
        ax.bar(range(len(shown)), means, yerr=np.nan_to_num(stds), capsize=3,
               color=["k" if v == "confu" else "0.6" for v in shown])  # fmt: skip
        ax.set_xticks(range(len(shown)), shown, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("tau (tokens per target forward)")
        ax.set_title(f"T = {temp}")
    return fig


def depth_figure(table: pd.DataFrame, variants: Sequence[str], depth: int):
    from paperflow.core import plots

    fig, axes = plots.subplots(1, width=5.0, height=3.8)
    ax = np.atleast_1d(axes)[0]
    sub = table[np.isclose(table.temperature, 0.0)]
    for v in variants:
        rows = sub[sub.variant == v]
        if rows.empty:
            continue
        ys = [rows[f"acc_depth{i}"].mean() for i in range(1, depth + 1)]
        ax.plot(range(1, depth + 1), ys, marker="o", label=v, lw=2.5 if v == "confu" else 1.0)
    ax.set_xlabel("draft depth")
    ax.set_ylabel("acceptance | parent accepted (T = 0)")
    ax.legend(fontsize=7)
    return fig


def build_report(frame: pd.DataFrame, history: pd.DataFrame, drafts: pd.DataFrame, params: Mapping[str, Any]):
    depth = int(params["decoding"]["depth"])
    temps = [float(t) for t in params["decoding"]["temperatures"]]
    table = tau_table(frame, depth)
    cl = claims(frame, params)
    variants = list(dict.fromkeys(frame.variant))
    agg = []
    for (variant, temp), g in table.groupby(["variant", "temperature"]):
        agg.append({
            "variant": variant, "T": temp, "tau": mean_std_text(g.tau.tolist()),
            "accepted/cycle": mean_std_text(g.accepted_per_cycle.tolist()),
            **{f"depth {i}": mean_std_text(g[f"acc_depth{i}"].tolist(), 2) for i in range(1, depth + 1)},
            "lossless": mean_std_text(g.lossless.tolist()), "SR_sim": mean_std_text(g.sr_sim.tolist()),
        })  # fmt: skip
    exact = history.groupby("seed").last()[[c for c in history.columns if c.startswith("exact_")]]
    refs = frame[(frame.variant.isin(["vanilla", "eagle3", "eagle3_extra", "confu"])) & frame.hf_greedy_equal.notna()]
    hf_line = (
        f"On the first prompts of each seed ({len(refs)} decodings), transformers' `generate` greedy and "
        f"`generate(assistant_model=...)` agree with every method's output in "
        f"{fmt(float(refs.hf_greedy_equal.astype(float).mean()), 3)} and "
        f"{fmt(float(refs.hf_assisted_equal.astype(float).mean()), 3)} of cases."
        if len(refs)
        else "No transformers reference was run (n_reference = 0)."
    )
    final = drafts.groupby(["method", "seed"]).last().reset_index()
    acc_cols = [c for c in final.columns if c.startswith("acc_step")]
    draft_rows = [
        {"method": m, "final loss": mean_std_text(g.loss.tolist()),
         **{c.replace("acc_", "top-1 agreement "): mean_std_text(g[c].tolist()) for c in acc_cols}}
        for m, g in final.groupby("method")
    ]  # fmt: skip
    sections = [
        ("Target", "Greedy exact match of the target on the test prompts per seed: "
         + "; ".join(f"seed {s}: " + ", ".join(f"{c[6:]} {v:.3f}" for c, v in row.items()) for s, row in exact.iterrows())
         + ". The drafts imitate the target's own continuations (regenerated, EAGLE-3's practice), so the target's "
         "accuracy bounds nothing here; it only sets how predictable its outputs are."),
        ("Acceptance per method (mean ± std over seeds)", markdown_table(agg)),
        ("Lossless references", hf_line),
        ("Draft training (last step; agreement of the draft's argmax with the target's, per unrolled step)",
         markdown_table(draft_rows)),
        ("Cost model", f"SR_sim = tau / (1 + D c_draft + beta T_verify) with D = {depth}, beta = 0 (CPU, tiny "
         "models: no verification cost is measured), c_draft = the draft's weight count over the target's outside "
         "the embeddings. ConFu's verification reads 2T + 1 tokens instead of T; with beta = 0 that costs nothing "
         "here, which flatters ConFu on a GPU where T is large."),
    ]  # fmt: skip
    return Report(
        title="ConFu: contemplate-the-future drafts for speculative decoding",
        summary=(
            "A tiny Llama target (trained once per seed on the digit world's sort and key-value plan) is decoded by "
            "EAGLE-2 trees (budget T, top-k, depth D) drafted by a vanilla one-layer LM, an EAGLE-3 head, the EAGLE-3 "
            "head trained further (the paper's control) and ConFu (from the same EAGLE-3 head, for the same extra "
            "steps), and verified in one target pass. tau = tokens generated after the prefill / target forwards."
        ),
        claims=cl,
        sections=sections,
        figures=[
            Figure(
                "figure_tau",
                "tau per method and temperature (mean ± std over seeds)",
                tau_figure(table, variants, temps),
            ),
            Figure("figure_depth", "Acceptance per depth at T = 0", depth_figure(table, variants, depth)),
        ],  # fmt: skip
        tables=[
            Table("table_tau", "Per variant, temperature and seed: tau, acceptance per depth, lossless share", table),
            Table(
                "table_depth",
                "Per-depth acceptance (mean over seeds)",
                table.groupby(["variant", "temperature"])[[f"acc_depth{i}" for i in range(1, depth + 1)]]
                .mean()
                .reset_index(),
            ),
        ],  # fmt: skip
        limitations=[
            "Wall-clock speed-ups cannot be measured with tiny models on a CPU; only the cost-model SR is given.",
            "The 8-11% magnitude and the natural-language future uncertainty of the paper cannot be reproduced on a "
            "synthetic digit task (spec section 7).",
        ],
        metrics={"tau": table.astype(object).where(table.notna(), None).to_dict("records")},
    )
