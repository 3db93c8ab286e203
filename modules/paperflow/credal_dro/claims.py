"""credal_dro's claims, tables, frontier figure and report, computed from the evaluation tables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import frames as frames_lib
from paperflow.core import plots
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table, statistic_claim

LABELS = {
    "saa": "plain SAA",
    "saa_trunc": "SAA (eps = 0, truncated to the bulk)",
    "lv": "LV (ours)",
    "cvar": "CVaR-DRO",
    "kl": "KL-DRO",
    "erm_lad": "ERM (LAD)",
    "ridge": "Ridge",
    "wass": "Wasserstein-DRO",
    "or_wass": "OR-WDRO",
    "erm": "ERM",
    "groupdro": "GroupDRO",
    "lv_group": "LV-Group (ours)",
}
PAPER_CALIFORNIA = {
    "lv": 10.7,
    "cvar": 13.0,
    "wass": 12.3,
    "ridge": 13.2,
    "erm_lad": 12.7,
}  # spec §5, Table 3 MAE (1e4 $)
PAPER_MAE_TOLERANCE = 0.05  # spec §10.6: LV's MAE within 5 % of 10.7
REGRESSION_METRICS = ("mae", "rmse", "p98", "cvar2")  # spec §8, Table 3's four columns


def per_seed(
    frame: pd.DataFrame, method: str, metric: str, seeds: Sequence[int], param: float | None = None
) -> list[float]:
    """Per-seed value of `metric` for `method` at grid value `param` (None: the validated choice)."""
    rows = frame[frame.chosen] if param is None else frame[np.isclose(frame.param, param)]
    return frames_lib.per_seed(rows, seeds, method=method, metric=metric)


def _beats(frame: pd.DataFrame, cfg: Mapping[str, Any], seeds: Sequence[int], rival: str, gated: bool) -> list[Claim]:
    """LV(eps) beats `rival` on contaminated mean and std for each claim eps, and LV(first claim eps) is within
    the tolerance of `rival`'s clean mean."""
    ref = {k: per_seed(frame, rival, k, seeds, 0.0) for k in ("cont_mean", "cont_std", "clean_mean")}
    suffix = "_trunc" if rival == "saa_trunc" else ""
    claims = []
    for eps in cfg["claim"]["eps"]:
        for metric, what in (("cont_mean", "mean"), ("cont_std", "std")):
            claims.append(
                compare_claim(
                    id=f"nv_lv{eps:g}_{metric}_lt_saa{suffix}",
                    statement=f"newsvendor, contaminated test: LV (eps = {eps:g}) has lower OOS cost {what} than {LABELS[rival]}",
                    values=per_seed(frame, "lv", metric, seeds, eps),
                    threshold_values=ref[metric],
                    seeds=seeds,
                    comparison="<",
                    gated=gated,
                    paper_value="LV best mean-variance frontier under contamination (qualitative)",
                )
            )
    eps0, tol = cfg["claim"]["eps"][0], cfg["claim"]["clean_tolerance"]
    claims.append(
        compare_claim(
            id=f"nv_lv{eps0:g}_clean_within_{tol:g}" + ("_of_saa_trunc" if suffix else ""),
            statement=f"newsvendor, clean test: LV (eps = {eps0:g}) mean cost within +{tol:.0%} of {LABELS[rival]}'s",
            values=per_seed(frame, "lv", "clean_mean", seeds, eps0),
            threshold=(1 + tol) * float(np.mean(ref["clean_mean"])),
            seeds=seeds,
            comparison="<=",
            gated=gated,
        )
    )
    return claims


def newsvendor_claims(frame: pd.DataFrame, cfg: Mapping[str, Any], seeds: Sequence[int]) -> list[Claim]:
    """Spec §7 (gated): LV(eps) beats "SAA (eps = 0)", the truncated SAA that LV is at eps = 0, on contaminated
    mean and std for each claim eps; LV(0.1) is within the tolerance of its clean mean; the clean mean is
    non-decreasing in eps. The same comparisons against plain SAA (every central sample) are reported."""
    claims = _beats(frame, cfg, seeds, "saa_trunc", gated=True)
    grid = sorted(cfg["methods"]["lv"])
    curves = np.array([per_seed(frame, "lv", "clean_mean", seeds, e) for e in grid])  # (eps, seed)
    claims.append(
        compare_claim(
            id="nv_clean_mean_nondecreasing_in_eps",
            statement=f"newsvendor, clean test: mean cost is non-decreasing in eps over {grid} (per seed, the smallest step; stricter than the seed-averaged curve)",
            values=list(np.diff(curves, axis=0).min(axis=0)),
            threshold=0.0,
            seeds=seeds,
            comparison=">=",
            paper_value="on clean data LV is conservative at large eps",
        )
    )
    claims += _beats(frame, cfg, seeds, "saa", gated=False)
    best = max(grid)
    claims.append(
        compare_claim(
            id=f"nv_lv{best:g}_cont_mean_lt_truncated_saa",
            statement=f"newsvendor, contaminated test: LV (eps = {best:g}) beats {LABELS['saa_trunc']}",
            values=per_seed(frame, "lv", "cont_mean", seeds, best),
            threshold_values=per_seed(frame, "saa_trunc", "cont_mean", seeds, 0.0),
            seeds=seeds,
            comparison="<",
            gated=False,
        )
    )
    for rival in ("cvar", "kl"):
        if rival not in cfg["methods"]:
            continue
        best_rival = np.nanmin([per_seed(frame, rival, "cont_mean", seeds, p) for p in cfg["methods"][rival]], axis=0)
        claims.append(
            compare_claim(
                id=f"nv_best_lv_cont_mean_lt_best_{rival}",
                statement=f"newsvendor, contaminated test: LV at its best eps has lower mean cost than {LABELS[rival]} at its best parameter (oracle choice for both)",
                values=list(np.nanmin([per_seed(frame, "lv", "cont_mean", seeds, e) for e in grid], axis=0)),
                threshold_values=list(best_rival),
                seeds=seeds,
                comparison="<",
                gated=False,
            )
        )
    return claims


def coverage_claim(frame: pd.DataFrame, exp: str, seeds: Sequence[int]) -> Claim:
    bound = per_seed(frame, "bulk", "mass_lower_bound", seeds, 0.0)[0]
    return compare_claim(
        id=f"{exp}_bulk_test_coverage",
        statement=f"{exp}: share of the (clean) test set inside the bulk >= the DKW bound 1 - gamma (Lemma 3.2; holds in-distribution, shifts may break it)",
        values=per_seed(frame, "bulk", "test_coverage", seeds, 0.0),
        threshold=bound,
        seeds=seeds,
        comparison=">=",
        gated=False,
    )


def regression_claims(frame: pd.DataFrame, cfg: Mapping[str, Any], seeds: Sequence[int]) -> list[Claim]:
    """LV against every rival on the four metrics of Table 3 (validated choices). On California these are the
    spec §10.6 acceptance check and gated: LV best of the paper's five methods on MAE, RMSE, P98 and CVaR_2%,
    and LV's mean MAE within 5 % of the paper's 10.7 on either side. The synthetic stand-in only reports."""
    claims = []
    california = cfg["source"] == "california"
    for metric in REGRESSION_METRICS:
        for rival in (m for m in cfg["methods"] if m != "lv"):
            paper = (
                f"California MAE: LV {PAPER_CALIFORNIA['lv']} vs {LABELS[rival]} {PAPER_CALIFORNIA[rival]}"
                if metric == "mae" and rival in PAPER_CALIFORNIA
                else None
            )
            claims.append(
                compare_claim(
                    id=f"reg_lv_{metric}_lt_{rival}",
                    statement=f"{'California' if california else 'synthetic geo-shift'} regression: LV has lower test {metric.upper()} than {LABELS[rival]} (validated choices)",
                    values=per_seed(frame, "lv", metric, seeds),
                    threshold_values=per_seed(frame, rival, metric, seeds),
                    seeds=seeds,
                    comparison="<",
                    gated=california and rival in PAPER_CALIFORNIA,
                    paper_value=paper,
                )
            )
    if california:
        mae = per_seed(frame, "lv", "mae", seeds)
        paper_mae, tol = PAPER_CALIFORNIA["lv"], PAPER_MAE_TOLERANCE
        claims.append(
            statistic_claim(
                id="reg_lv_mae_near_paper",
                statement=f"California: LV's mean MAE within {tol:.0%} of the paper's {paper_mae} on either side (spec §10.6)",
                value=abs(float(np.mean(mae)) - paper_mae) / paper_mae,
                label=f"abs(mean MAE - {paper_mae}) / {paper_mae}",
                values=mae,
                seeds=seeds,
                comparison="<=",
                threshold=tol,
                paper_value="10.7 (0.72)",
            )
        )
    return claims


def text_claims(frame: pd.DataFrame, cfg: Mapping[str, Any], seeds: Sequence[int]) -> list[Claim]:
    claims = []
    if "lv_group" in cfg["methods"]:
        for rival in (m for m in ("groupdro", "erm") if m in cfg["methods"]):
            claims.append(
                compare_claim(
                    id=f"text_lv_group_worst_ge_{rival}",
                    statement=f"text: LV-Group worst-slice accuracy >= {LABELS[rival]}'s",
                    values=per_seed(frame, "lv_group", "worst_slice_acc", seeds),
                    threshold_values=per_seed(frame, rival, "worst_slice_acc", seeds),
                    seeds=seeds,
                    comparison=">=",
                    gated=False,
                    paper_value="CivilComments worst slice: LV-Group 0.516, GroupDRO 0.456",
                )
            )
    if {"erm", "groupdro"} <= set(cfg["methods"]):
        claims.append(
            compare_claim(
                id="text_erm_worst_lt_groupdro",
                statement="text: ERM has lower worst-slice accuracy than GroupDRO (spec: expect ERM worst)",
                values=per_seed(frame, "erm", "worst_slice_acc", seeds),
                threshold_values=per_seed(frame, "groupdro", "worst_slice_acc", seeds),
                seeds=seeds,
                comparison="<",
                gated=False,
            )
        )
    return claims


def summary_table(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean and std over seeds of every metric, per experiment, method, parameter and validated choice."""
    long = pd.concat([f.assign(experiment=e) for e, f in frames.items()], ignore_index=True)
    return frames_lib.seed_summary(long, ["experiment", "method", "param", "chosen", "metric"])


def runtime_table(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Seconds per replication (central sampling + every grid value's solve + validation) per method."""
    rows = []
    for exp, f in frames.items():
        part = f[f.metric == "runtime_s"].drop_duplicates(["seed", "method"])
        for method, g in part.groupby("method"):
            rows.append(
                {
                    "experiment": exp,
                    "method": method,
                    "runtime_s_mean": g.value.mean(),
                    "runtime_s_std": g.value.std(ddof=1),
                    "n_seeds": len(g),
                }
            )
        solve = f[f.metric == "solve_s"]
        for (method, param), g in solve.groupby(["method", "param"]):
            rows.append(
                {
                    "experiment": exp,
                    "method": f"{method} (one solve, param {param:g})",
                    "runtime_s_mean": g.value.mean(),
                    "runtime_s_std": g.value.std(ddof=1),
                    "n_seeds": len(g),
                }
            )
    return pd.DataFrame(rows)


def _curve(table: pd.DataFrame, exp: str, method: str, mx: str, my: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = table[(table.experiment == exp) & (table.method == method)]
    x = t[t.metric == mx].sort_values("param")
    y = t[t.metric == my].sort_values("param")
    return x["mean"].to_numpy(), y["mean"].to_numpy(), x["param"].to_numpy()


FRONTIERS = {
    "newsvendor": [
        ("cont_std", "cont_mean", "contaminated test: std of cost", "mean of cost"),
        ("clean_mean", "cont_mean", "clean test: mean cost", "contaminated test: mean cost"),
    ],
    "regression": [("mae", "p98", "test MAE", "test P98 abs. error")],
    "text": [("avg_acc", "worst_slice_acc", "average accuracy", "worst-slice accuracy")],
}


def frontier_figure(table: pd.DataFrame, experiments: Sequence[str]) -> Figure:
    panels = [(e, spec) for e in experiments for spec in FRONTIERS[e]]
    fig, axes = plots.subplots(len(panels))
    for ax, (exp, (mx, my, lx, ly)) in zip(axes, panels):
        for method in [m for m in table[table.experiment == exp].method.unique() if m != "bulk"]:
            x, y, p = _curve(table, exp, method, mx, my)
            ax.plot(x, y, "o-", ms=4, lw=1.2, label=LABELS.get(method, method))
            for xi, yi, pi in zip(x, y, p):
                ax.annotate(f"{pi:g}", (xi, yi), fontsize=6, textcoords="offset points", xytext=(2, 2))
        ax.set_xlabel(lx)
        ax.set_ylabel(ly)
        ax.set_title(f"{exp}: mean over seeds, points labelled by parameter", fontsize=8)
        ax.legend(fontsize=7)
    return Figure(
        "figure_frontier", "Robustness-accuracy frontiers per experiment (grid of each method's parameter)", fig
    )


def headline_rows(table: pd.DataFrame, exp: str, metrics: Sequence[str], chosen_only: bool) -> list[dict[str, Any]]:
    t = table[(table.experiment == exp) & (table.method != "bulk")]
    if chosen_only:
        t = t[t.chosen]
    rows = []
    for (method, param), g in t.groupby(["method", "param"], sort=True):
        vals = dict(zip(g.metric, zip(g["mean"], g["std"])))
        row: dict[str, Any] = {"method": LABELS.get(method, method), "param": f"{param:g}"}
        for m in metrics:
            mean, std = vals.get(m, (np.nan, np.nan))
            row[m] = f"{mean:.4g} ± {std:.2g}" if np.isfinite(mean) else "n/a"
        rows.append(row)
    return rows


def bulk_rows(bulks: Mapping[str, Mapping[str, dict]]) -> list[dict[str, Any]]:
    rows = []
    for exp, per in bulks.items():
        for seed, doc in per.items():
            cert = doc["certificate"]
            rows.append(
                {
                    "experiment": exp,
                    "seed": seed,
                    "geometry": " x ".join(b["geometry"] for b in doc["blocks"]),
                    "t_hat": ", ".join(f"{b['t']:.3g}" for b in doc["blocks"]),
                    "gamma": doc["gamma"],
                    "delta": doc["delta"],
                    "m_select": doc["m_select"],
                    "select_coverage": cert["select_coverage"],
                    "fit_coverage": cert["fit_coverage"],
                }
            )
    return rows


LIMITATIONS = [
    "The newsvendor generator, costs and contamination law are the spec's reconstruction [R]; the paper's exact settings are not public to us.",
    "OR-WDRO runs in the regression only (dro.ORWDRO has no newsvendor loss) and KL-BDRO is not run (see the README); KL-DRO with a Bayesian centre stands in for DRO-BAS.",
    "At tiny/smoke scale the regression is a synthetic longitude-like shift and the text set is template comments embedded by MiniLM; California and CivilComments need `scale=paper`.",
    "Runtimes are Clarabel/HiGHS on 2 shared CPU cores, not the paper's MOSEK timings.",
]


def build_report(
    *,
    frames: Mapping[str, pd.DataFrame],
    bulks: Mapping[str, Mapping[str, dict]],
    params: Mapping[str, Any],
) -> Report:
    exps, cfg, seeds = list(frames), params["cfg"], params["seeds"]
    builders = {"newsvendor": newsvendor_claims, "regression": regression_claims, "text": text_claims}
    claims: list[Claim] = []
    for exp in exps:
        claims += builders[exp](frames[exp], cfg[exp], list(seeds[exp]))
        claims.append(coverage_claim(frames[exp], exp, list(seeds[exp])))
    table = summary_table(frames)
    runtime = runtime_table(frames)
    metric_sets = {
        "newsvendor": (["cont_mean", "cont_std", "clean_mean", "clean_std", "cont_msd", "clean_msd"], False),
        "regression": (list(REGRESSION_METRICS), True),
        "text": (["avg_acc", "worst_slice_acc"], True),
    }
    sections = []
    for exp in exps:
        metrics, chosen = metric_sets[exp]
        label = {
            "newsvendor": "Newsvendor: OOS cost of every decision (mean ± std over seeds)",
            "regression": "Regression (validated parameter per method; Table 3 analogue, errors in the target's unit)",
            "text": "Text (validated parameter per method)",
        }[exp]
        sections.append((label, markdown_table(headline_rows(table, exp, metrics, chosen))))
    sections += [
        ("Runtime per replication, seconds (Table 4 analogue)", markdown_table(runtime.to_dict(orient="records"))),
        ("Bulk calibration (DKW threshold and certificate per seed)", markdown_table(bulk_rows(bulks))),
    ]
    return Report(
        title="Bulk-calibrated credal ambiguity sets: LV-DRO under contamination",
        summary=(
            f"Experiments: {', '.join(exps)}. Gated claims are the spec §7 newsvendor claims against SAA (eps = 0), the "
            "truncated SAA that LV is at eps = 0 (the same comparisons against plain SAA are reported), and on California "
            "the spec §10.6 check; the others are reported. "
            "LV = (1 - eps) mean over central samples inside the DKW-calibrated bulk + eps sup over the bulk."
        ),
        claims=claims,
        sections=sections,
        figures=[frontier_figure(table, exps)],
        tables=[
            Table("table_results", "Every metric: mean, std and number of seeds per method and parameter", table),
            Table("table_runtime", "Seconds per replication and per solve, per method", runtime),
        ],
        limitations=LIMITATIONS,
        metrics={
            "table": table.replace({np.nan: None}).to_dict(orient="records"),
            "runtime": runtime.replace({np.nan: None}).to_dict(orient="records"),
            "limitation": LIMITATIONS[0],
        },
    )
