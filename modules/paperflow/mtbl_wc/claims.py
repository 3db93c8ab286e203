"""mtbl_wc's metrics table (judged by the claims of config/mtbl_wc.yaml; spec §7, §10.6), tables, figures and
report, from the evaluation tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import frames as frames_lib
from paperflow.core import plots
from paperflow.core.claims import long_table
from paperflow.core.report import Figure, Report, Table, markdown_table
from paperflow.mtbl_wc.settings import CLEANING_AT_MIDDLE, CLEANING_STEER

MIDDLE = (0.25, 0.75)  # "middle" preferences of the concave-front check: r_1 strictly inside


def over_preferences(frame: pd.DataFrame, metric: str, agg: str, keep=None) -> pd.Series:
    """Per (method, seed): `agg` (max / min / mean) of `metric` over the preferences whose r_1 `keep` accepts."""
    rows = frame[frame.metric == metric]
    if keep is not None:
        rows = rows[keep(rows.r1.to_numpy())]
    return rows.groupby(["method", "seed"]).value.agg(agg)


def at_preference(frame: pd.DataFrame, metric: str, r1: float) -> pd.Series:
    """Per (method, seed): `metric` at the preference r_1 = `r1`."""
    return over_preferences(frame, metric, "mean", lambda r: np.isclose(r, r1))


def steer(frame: pd.DataFrame, metric: str) -> pd.Series:
    """Per (method, seed): `metric` at the largest r_1 minus at the smallest."""
    rows = frame[(frame.metric == metric) & frame.r1.notna()]
    hi = at_preference(rows, metric, float(rows.r1.max()))
    lo = at_preference(rows, metric, float(rows.r1.min()))
    return hi - lo


def rate_ratio(frame: pd.DataFrame, checkpoints: Sequence[int]) -> pd.Series:
    """Per (method, seed): the smallest K_best(c_i) / K_best(c_{i+1}) over preferences and consecutive checkpoints
    (NaN where a checkpoint lacks a preference)."""
    wide = frame[frame.metric.str.startswith("K_best@")].pivot_table(
        index=["method", "seed", "pref"], columns="metric", values="value", dropna=False
    )
    ratios = pd.concat(
        [wide[f"K_best@{a}"] / wide[f"K_best@{b}"] for a, b in zip(checkpoints[:-1], checkpoints[1:])], axis=1
    )
    return ratios.groupby(level=["method", "seed"]).agg(lambda part: part.to_numpy().min()).min(axis=1, skipna=False)


def rate_slope(curves: pd.DataFrame) -> pd.Series:
    """Per (method, seed): the mean over preferences of the log-log slope of K_best over the last decade of steps."""
    out = {}
    for (method, seed), part in curves[curves.step > 0].groupby(["method", "seed"]):
        last = part[part.step >= part.step.max() / 10]
        slopes = [np.polyfit(np.log(g.step), np.log(g.K_best), 1)[0] for _, g in last.groupby("pref")]
        out[(method, seed)] = float(np.mean(slopes))
    return pd.Series(out, dtype=float)


def problem_metrics(frame: pd.DataFrame, curves: pd.DataFrame, spec: Mapping[str, Any]) -> dict[str, pd.Series]:
    """The per-(method, seed) metrics of one problem that its claims read (names: settings.*_CLAIM_METRICS)."""
    middle = lambda r1: (r1 > MIDDLE[0]) & (r1 < MIDDLE[1])  # noqa: E731
    if spec["kind"] == "quadratic":
        return {
            "rel_dist_wc/max": over_preferences(frame, "rel_dist_wc", "max"),
            "h_norm/max": over_preferences(frame, "h_norm", "max"),
            "angle_deg/max": over_preferences(frame, "angle_deg", "max"),
            "angle_deg/min_off_middle": over_preferences(frame, "angle_deg", "min", lambda r1: ~np.isclose(r1, 0.5)),
            "K_best/rate_ratio_min": rate_ratio(frame, spec["rate_checkpoints"]),
            "K_best/slope_last_decade": rate_slope(curves),
        }
    if spec["kind"] == "concave":
        return {
            "rel_dist_wc_f/max_middle": over_preferences(frame, "rel_dist_wc_f", "max", middle),
            "min_f_rel/max_middle": over_preferences(frame, "min_f_rel", "max", middle),
        }
    out = {CLEANING_STEER: steer(frame, "f1")}
    if np.isclose(frame.r1.dropna().unique(), 0.5).any():
        out |= {f"{m}/r0.5": at_preference(frame, m, 0.5) for m in CLEANING_AT_MIDDLE}
    return out


def metrics_table(
    frames: Mapping[str, pd.DataFrame],
    curves: Mapping[str, pd.DataFrame],
    specs: Mapping[str, Mapping[str, Any]],
    scale: str,
) -> pd.DataFrame:
    """The long metrics table the claims of config/mtbl_wc.yaml are judged on: one row per (seed, method,
    "<problem>/<metric>/<how>")."""
    rows = [
        {"seed": seed, "method": method, "metric": f"{name}/{metric}", "value": value}
        for name, frame in frames.items()
        for metric, series in problem_metrics(frame, curves[name], specs[name]).items()
        for (method, seed), value in series.items()
    ]
    return long_table(rows, scale)


def summary_table(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean, std and number of seeds of every metric per problem, method and r_1 (NaN r_1: over all
    preferences, e.g. the hypervolume)."""
    long = pd.concat([f.assign(problem=n) for n, f in frames.items()], ignore_index=True)
    return frames_lib.seed_summary(long, ["problem", "method", "r1", "metric"], dropna=False)


def front_figure(fronts: Mapping[str, dict], frames: Mapping[str, pd.DataFrame], seed: int):
    names = list(fronts)
    fig, axes = plots.subplots(len(names))
    for ax, name in zip(axes, names):
        exact = fronts[name]
        ax.plot(exact["front"][:, 0], exact["front"][:, 1], "k-", lw=1.2, label="exact front")
        ax.plot(exact["f_wc"][:, 0], exact["f_wc"][:, 1], "k*", ms=9, label="closed-form WC points")
        frame = frames[name]
        for method, marker in (("wc", "o"), ("ls", "s"), ("mgda", "^"), ("wc_sto", "x")):
            pts = frame[(frame.method == method) & (frame.seed == seed)].pivot(
                index="pref", columns="metric", values="value"
            )
            if len(pts) and "f1" in pts:
                ax.plot(pts.f1, pts.f2, marker, mfc="none", label=method)
        ax.set_xlabel("f_1")
        ax.set_ylabel("f_2")
        ax.set_title(f"{name} (seed {seed})")
        ax.legend(fontsize=7)
    return fig


def kkt_figure(curves: pd.DataFrame, seed: int):
    fig, axes = plots.subplots(1, width=5.5, height=4.2)
    ax = axes[0]
    part = curves[(curves.seed == seed) & (curves.step > 0)]
    for (method, pref), g in part.groupby(["method", "pref"]):
        ax.loglog(
            g.step,
            g.K_best,
            lw=1,
            alpha=0.8,
            label=f"{method} r{pref}" if pref == 0 else None,
            color={"wc": "C0", "ls": "C1", "mgda": "C2", "wc_sto": "C3"}.get(method, "C4"),
        )
    steps = np.sort(part.step.unique())
    anchor = part[part.step == steps[0]].K_best.median()
    ax.loglog(steps, anchor * (steps / steps[0]) ** -0.5, "k--", lw=1.5, label="T^(-1/2) reference")
    ax.set_xlabel("iteration T")
    ax.set_ylabel("best-iterate K (KKT residual)")
    ax.set_title(f"quadratic, seed {seed}")
    ax.legend(fontsize=7)
    return fig


LIMITATIONS = [
    "The paper's full text, benchmarks and numbers were not available: the algorithm, the KKT measure and the experiments are reconstructed from its abstract (spec §1-2).",
    "Hyper-cleaning uses a linear model on whitened digits features (8x8); the paper's benchmarks (MNIST-scale) run only at `scale=paper`.",
    "With h = grad_y g, the warm start of hyper-cleaning is already feasible and nearly KKT-stationary, so hyper-cleaning returns the final iterate, not the best by K.",
    "The stochastic variant uses an additive Gaussian gradient oracle (bounded variance), not minibatches.",
]


def build_report(
    *,
    frames: Mapping[str, pd.DataFrame],
    curves: Mapping[str, pd.DataFrame],
    fronts: Mapping[str, dict],
    specs: Mapping[str, dict],
    seeds: Sequence[int],
    scale: str,
) -> Report:
    seeds = list(seeds)
    table = summary_table(frames)
    synthetic = {n: f for n, f in fronts.items() if specs[n]["kind"] in ("quadratic", "concave")}
    quad = [n for n in frames if specs[n]["kind"] == "quadratic"]
    figures = [
        Figure(
            "figure_fronts",
            "Explored fronts against the exact front (closed form)",
            front_figure(synthetic, frames, seeds[0]),
        ),
        Figure(
            "figure_kkt",
            "Best-iterate KKT residual against iterations (log-log) with a T^(-1/2) reference",
            kkt_figure(
                curves[quad[0]] if quad else pd.DataFrame(columns=["seed", "step", "method", "pref", "K_best"]),
                seeds[0],
            ),
        ),
    ]
    keep = [
        "rel_dist_wc",
        "angle_deg",
        "h_norm",
        "K",
        "hypervolume",
        "min_f_rel",
        "max_f",
        "f1",
        "f2",
        "test_acc",
        "detect_f1",
    ]
    rows = [
        {
            "problem": r.problem,
            "method": r.method,
            "r1": "all" if np.isnan(r.r1) else f"{r.r1:g}",
            "metric": r.metric,
            "mean ± std": f"{r['mean']:.4g} ± {r['std']:.2g}",
        }
        for _, r in table[table.metric.isin(keep)].iterrows()
    ]
    return Report(
        title="mtbl_wc: multi-task bilevel learning by a weighted-Chebyshev penalty method",
        summary=(
            f"Problems {', '.join(frames)}; methods per problem as configured; seeds {', '.join(map(str, seeds))}. "
            "WC-penalty, LS-penalty and MGDA-penalty share one loop (only the weights on the UL gradients differ)."
        ),
        table=metrics_table(frames, curves, specs, scale),
        sections=[("Metrics (mean ± std over seeds, per preference r_1)", markdown_table(rows))],
        figures=figures,
        tables=[
            Table("table_metrics", "Every metric: mean, std and number of seeds per problem, method and r_1", table)
        ],
        limitations=LIMITATIONS,
        metrics={"table": table.replace({np.nan: None}).to_dict(orient="records"), "limitation": LIMITATIONS[0]},
    )
