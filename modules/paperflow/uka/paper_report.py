"""UKA's report at paper scale (spec sections 5 and 8): success rate (SR), average turns (AT, failures counted as T),
posterior entropy after turn 3 and the judge's win rate against PRINCIPLES-like, per method and seed, from the
test dialogues' tables, and the long metrics table (per test case) on which the paper-scale claims of
config/uka.yaml are judged, reported, not gated. numpy, pandas and matplotlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from paperflow.core.claims import long_table
from paperflow.core.report import Figure, Report, Table, markdown_table, mean_std_text
from paperflow.uka.settings import PAPER_COLUMNS

LABELS = {
    "standard": "Standard",
    "uniform_prior": "Uniform prior (control)",
    "principles": "PRINCIPLES-like",
    "uka": "UKA",
    "uka_no_eig_train": "UKA without EIG in training",
    "uka_no_belief_test": "UKA with a uniform belief at test",
    "uka_permuted_tom": "UKA with a permuted ToM",
}


def method_table(per_case: pd.DataFrame, wins: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, seed): SR, AT, entropy after turn 3, win rate against the reference."""
    g = per_case.groupby(["method", "seed"])
    out = pd.DataFrame(
        {"sr": g["success"].mean(), "at": g["turns"].mean(), "entropy_t3": g["entropy_t3"].mean(), "cases": g.size()}
    ).reset_index()
    if not wins.empty:
        w = wins.groupby(["method", "seed"]).agg(win_rate=("win", "mean"), judged=("win", "count")).reset_index()
        out = out.merge(w, on=["method", "seed"], how="left")
    else:
        out = out.assign(win_rate=np.nan, judged=0)
    return out


def _per_seed(table: pd.DataFrame, method: str, column: str) -> pd.Series:
    return table[table["method"] == method].set_index("seed")[column]


def metrics_table(per_case: pd.DataFrame, wins: pd.DataFrame, scale: str) -> pd.DataFrame:
    """The long metrics table the config's claims are judged on: per (method, seed, test case) "esconv/<column>"
    for settings.PAPER_COLUMNS and, for the judged methods, "esconv/win_rate" (the case's win against the
    reference: 1, 0.5 for a split verdict, 0); the unit is the case (the same 130 cases for every method)."""
    parts = [(per_case, column, f"esconv/{column}") for column in PAPER_COLUMNS]
    if not wins.empty:
        parts.append((wins, "win", "esconv/win_rate"))
    rows = [
        pd.DataFrame(
            {
                "seed": f["seed"],
                "unit": f["case"].astype(str),
                "method": f["method"],
                "metric": name,
                "value": f[column].astype(float),
            }
        )
        for f, column, name in parts
    ]
    return long_table(pd.concat(rows, ignore_index=True).to_dict("records"), scale)


def figure_success(table: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 3.2))
    methods = list(dict.fromkeys(table["method"]))
    means = [table[table["method"] == m]["sr"].mean() for m in methods]
    ax.bar(range(len(methods)), means, color="#4c72b0")
    ax.set_xticks(range(len(methods)), [LABELS[m] for m in methods], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("success rate (ESConv test)")
    ax.set_ylim(0, 1)
    fig.tight_layout()
    return fig


def _records(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The table's rows for metrics.json: NaN (Standard's entropy, the reference's own win rate) as null."""
    return [
        {
            k: (None if isinstance(v, float) and not np.isfinite(v) else v.item() if hasattr(v, "item") else v)
            for k, v in row.items()
        }
        for row in table.to_dict("records")
    ]


def acquisition_lines(attempts: pd.DataFrame) -> list[dict[str, Any]]:
    """Per trained method: self-play dialogues, simulated turns (revisions included), share of winning attempts."""
    if attempts.empty:
        return []
    g = attempts.groupby("method")
    return [
        {
            "method": LABELS[m],
            "dialogues": mean_std_text(list(a.groupby("seed")["dialogue"].nunique())),
            "simulated turns": mean_std_text(list(a.groupby("seed").size())),
            "winning attempts": mean_std_text(list(a.groupby("seed")["won"].mean())),
        }
        for m, a in g
    ]


def build_report(
    per_case: pd.DataFrame, wins: pd.DataFrame, params: Mapping[str, Any], attempts: pd.DataFrame | None = None
) -> Report:
    reference = params["win_rate"]["reference"]
    table = method_table(per_case, wins)
    lines = [
        {
            "method": LABELS[m],
            "SR": mean_std_text(list(_per_seed(table, m, "sr"))),
            "AT": mean_std_text(list(_per_seed(table, m, "at"))),
            "entropy after turn 3": mean_std_text(list(_per_seed(table, m, "entropy_t3"))),
            f"win rate vs {LABELS[reference]}": mean_std_text(list(_per_seed(table, m, "win_rate"))),
        }
        for m in dict.fromkeys(table["method"])
    ]
    p = params["pretrained"]
    return Report(
        title=f"UKA at paper scale: ESConv (PPDPP split) with {p['hub']} as agent, seeker and critic",
        summary=f"{p['hub']} at {p['revision']} behind a vLLM server plays the supporter (realising each planner's "
        f"strategy; Standard gets none), the help-seeker of each ESConv case, the critic "
        f"({params['simulation']['critic_samples']} samples, success when r_t >= {params['critic']['success_reward']}) "
        f"and the judge; at most {params['simulation']['turns']} turns.",
        table=metrics_table(per_case, wins, params["scale"]),
        sections=[
            ("SR, AT, posterior entropy and win rate (mean ± std over seeds)", markdown_table(lines)),
            (
                "Self-play knowledge acquisition",
                markdown_table(acquisition_lines(attempts if attempts is not None else pd.DataFrame())),
            ),
        ],
        figures=[Figure("figure_success", "Success rate per method (ESConv test)", figure_success(table))],
        tables=[Table("table_methods", "Per method and seed: SR, AT, entropy after turn 3, win rate", table)],
        limitations=[
            "The planners are the spec's reconstruction (section 2.3); the LLM realises their strategies.",
            "Standard keeps no belief, so its entropy is not defined (n/a).",
            "ExTES and the SAGE / Sentient evaluation are not wired (see workflows/uka/README.md).",
        ],
        metrics={"methods": _records(table), "reference": reference},
    )
