"""annealed_langevin's claims, tables, figures and report, computed from the evaluation curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from paperflow.annealed_langevin.evaluation import final_values
from paperflow.annealed_langevin.paths import LABELS
from paperflow.core import frames as frames_lib
from paperflow.core import plots  # noqa: F401 (selects the headless backend; publish saves the figures)
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table

# Official committed results (results/gmm_1d/T_1.0/KL_comparison.csv): 1-D GMM, T = 1, N = 5000, t_max = 150.
PAPER_FINAL_KL = {"diffusion": 0.015, "tempering": 0.271, "ula": 1.21, "daz": 0.023, "dilation": 0.765}
PAPER_SOURCE = "official repo, results/gmm_1d/T_1.0 (N = 5000, t_max = 150)"

GRID_TEXT = {"adaptive": "h = a(tau)/L(tau)^2", "uniform": "ULA's step a_pi/L_pi^2 for every path"}
Key = tuple[str, str, str]  # (target, path, T)


def per_seed(finals: Mapping[Key, pd.DataFrame], key: Key, column: str, seeds: Sequence[int]) -> list[float]:
    """`column` of run `key` per seed; NaN for every seed of a run that is missing (its claims then fail)."""
    if key not in finals:
        return [float("nan")] * len(seeds)
    return frames_lib.per_seed(finals[key], seeds, value=column)


def build_claims(
    finals: Mapping[Key, pd.DataFrame],
    *,
    claim_target: str,
    claim_T: str,
    seeds: Sequence[int],
    runs: Mapping[str, Mapping[str, Any]],
    scale: str,
) -> list[Claim]:
    """Spec §7 (gated): at the claim target and horizon, KL(diffusion) <= 0.1 KL(ULA), KL(diffusion) <=
    2 x the N-sample floor, KL(tempering) < 0.5 KL(ULA), and diffusion < tempering < ULA. Reported:
    every other path against ULA, diffusion against ULA on the other targets, and the distance to the
    official numbers (gated only at paper scale, spec §10.6)."""

    def kl(path: str, target: str = claim_target, T: str = claim_T) -> list[float]:
        return per_seed(finals, (target, path, T), "kl", seeds)

    where = f"{claim_target}, T = {claim_T}"
    ula, diff, temp = kl("ula"), kl("diffusion"), kl("tempering")
    floor = per_seed(finals, (claim_target, "diffusion", claim_T), "floor_kl", seeds)
    claims = [
        compare_claim(
            id="diffusion_le_0.1_ula",
            statement=f"{where}: final KL(diffusion) <= 0.1 x KL(ULA)",
            values=diff,
            threshold_values=[0.1 * v for v in ula],
            seeds=seeds,
            comparison="<=",
            paper_value=f"{PAPER_FINAL_KL['diffusion']} vs {PAPER_FINAL_KL['ula']} ({PAPER_SOURCE})",
        ),
        compare_claim(
            id="diffusion_le_2_floor",
            statement=f"{where}: final KL(diffusion) <= 2 x the N-sample noise floor",
            values=diff,
            threshold_values=[2 * v for v in floor],
            seeds=seeds,
            comparison="<=",
            paper_value=(
                "committed KL_gt 0.008 is the floor at bins / N = 0.02 (10000 exact samples, 200 bins); at the "
                "spec's N = 5000 and 200 bins it is 0.015 (spec §10.5 test)"
            ),
        ),
        compare_claim(
            id="tempering_lt_0.5_ula",
            statement=f"{where}: final KL(tempering) < 0.5 x KL(ULA)",
            values=temp,
            threshold_values=[0.5 * v for v in ula],
            seeds=seeds,
            comparison="<",
            paper_value=f"{PAPER_FINAL_KL['tempering']} vs {PAPER_FINAL_KL['ula']}",
        ),
        compare_claim(
            id="diffusion_lt_tempering",
            statement=f"{where}: ordering, final KL(diffusion) < KL(tempering)",
            values=diff,
            threshold_values=temp,
            seeds=seeds,
            comparison="<",
        ),
        compare_claim(
            id="tempering_lt_ula",
            statement=f"{where}: ordering, final KL(tempering) < KL(ULA)",
            values=temp,
            threshold_values=ula,
            seeds=seeds,
            comparison="<",
        ),
    ]
    for path in runs[claim_target]["paths"]:
        if path not in ("ula", "diffusion", "tempering"):
            claims.append(
                compare_claim(
                    id=f"{path}_lt_ula",
                    statement=f"{where}: final KL({LABELS[path]}) < KL(ULA) (reported only)",
                    values=kl(path),
                    threshold_values=ula,
                    seeds=seeds,
                    comparison="<",
                    gated=False,
                    paper_value=f"{PAPER_FINAL_KL.get(path)} vs {PAPER_FINAL_KL['ula']}",
                )
            )
    for target, run in runs.items():
        if target == claim_target or not {"ula", "diffusion"} <= set(run["paths"]):
            continue
        for T in run["horizons"]:
            claims.append(
                compare_claim(
                    id=f"diffusion_lt_ula_{target}_T{T}",
                    statement=f"{target}, T = {T}: final KL(diffusion) < KL(ULA), mean over {run['metric']} (reported only)",
                    values=kl("diffusion", target, T),
                    threshold_values=kl("ula", target, T),
                    seeds=seeds,
                    comparison="<",
                    gated=False,
                )
            )
    if claim_T == "1":
        for path, paper in PAPER_FINAL_KL.items():
            if path in runs[claim_target]["paths"]:
                claims.append(
                    compare_claim(
                        id=f"paper_value_{path}",
                        statement=f"{where}: |KL({LABELS[path]}) / {paper} - 1| <= 0.3 "
                        "(spec §10.6; gated at paper scale only)",
                        values=[abs(v / paper - 1) for v in kl(path)],
                        threshold=0.3,
                        seeds=seeds,
                        comparison="<=",
                        gated=scale == "paper",
                        paper_value=f"{paper} ({PAPER_SOURCE})",
                        limitation=None if scale == "paper" else "smaller N and t_max than the paper: not comparable",
                    )
                )
    return claims


def final_table(finals: Mapping[Key, pd.DataFrame]) -> pd.DataFrame:
    rows = []
    for (target, path, T), frame in sorted(finals.items()):
        rows.append(
            {
                "target": target,
                "path": path,
                "T": T,
                "n_seeds": len(frame),
                "kl_mean": frame.kl.mean(),
                "kl_std": frame.kl.std(ddof=1) if len(frame) > 1 else 0.0,
                "tv_mean": frame.tv.mean(),
                "tv_std": frame.tv.std(ddof=1) if len(frame) > 1 else 0.0,
                "floor_kl_mean": frame.floor_kl.mean(),
                "iterations": int(frame.iterations.max()),
                "t_end": float(frame.t.max()),
            }
        )
    return pd.DataFrame(rows)


def curve_figure(curves: Mapping[Key, pd.DataFrame], target: str, horizons: Sequence[str], metric: str):
    """Per horizon: the metric (mean over seeds and panels) against iteration (top) and time t (bottom),
    every path, with the mean noise floor dashed."""
    fig, axes = plt.subplots(2, len(horizons), figsize=(4.6 * len(horizons), 6.4), squeeze=False)
    for j, T in enumerate(horizons):
        floors = []
        for (tg, path, TT), curve in sorted(curves.items()):
            if tg != target or TT != T:
                continue
            mean = curve.groupby("it").agg(v=(metric, "mean"), t=("t", "mean"))
            axes[0][j].plot(mean.index, mean.v, label=LABELS[path])
            axes[1][j].plot(mean.t, mean.v, label=LABELS[path])
            floors.append(curve[f"floor_{metric}"].mean())
        for row in (0, 1):
            ax = axes[row][j]
            if floors:
                ax.axhline(float(np.mean(floors)), color="black", ls="--", lw=1, label="noise floor")
            ax.set_yscale("log")
            ax.set_xlabel("iteration" if row == 0 else "time t")
            ax.set_ylabel(f"histogram {metric.upper()}")
            ax.set_title(f"{target}, T = {T}")
            ax.legend(fontsize=7)
    return fig


def imaging_rows(imaging: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "path": m["path"],
            "T": m["T"],
            "iterations": m["iterations"],
            "psnr_mean": m["psnr_posterior_mean"],
            "psnr_observed": m["psnr_observed"],
        }
        for m in imaging
    ]


def limitations(scale: str, runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = [
        "KL is the histogram KL(particles || target) of the official code (200 bins over the ground-truth "
        "range); it has an N-dependent floor, reported beside every value. Which direction the title's "
        "'forward' KL means is not confirmed from the paper's text."
    ]
    if scale != "paper":
        sizes = "; ".join(
            f"{t}: N = {r['n_particles']}, t_max = {r['t_max']}, T in {r['horizons']}" for t, r in runs.items()
        )
        lines.append(
            f"Scale `{scale}` runs {sizes}; the paper uses N = 5000 and t_max = 150 (1-D), so the "
            "paper's plateau values are not expected here."
        )
        lines.append("The imaging experiment (pretrained diffusion prior) runs at paper scale only.")
    lines.append(
        "Particles start at the point x0 = -1 (a point mass, infinite KL at t = 0 in theory), as in the official code."
    )
    return lines


def figures(curves: Mapping[Key, pd.DataFrame], runs: Mapping[str, Mapping[str, Any]]) -> list[Figure]:
    """Per target, the KL and the TV curves (output keys figure_kl_<target>, figure_tv_<target>)."""
    return [
        Figure(
            f"figure_{metric}_{target}",
            f"{target}: histogram {metric.upper()} per path against iteration and time "
            "(mean over seeds), noise floor dashed",
            curve_figure(curves, target, runs[target]["horizons"], metric),
        )
        for target in runs
        for metric in ("kl", "tv")
    ]


def build_report(
    *,
    curves: Mapping[Key, pd.DataFrame],
    imaging: Sequence[Mapping[str, Any]],
    params: Mapping[str, Any],
    scale: str,
) -> Report:
    runs, seeds = params["runs"], list(params["seeds"])
    finals = {key: final_values(c) for key, c in curves.items()}
    claims = build_claims(
        finals, claim_target=params["claim_target"], claim_T=params["claim_T"], seeds=seeds, runs=runs, scale=scale
    )
    table = final_table(finals)
    rows = [
        {
            "target": r.target,
            "path": LABELS[r.path],
            "T": r.T,
            "final KL": f"{r.kl_mean:.4g} ± {r.kl_std:.2g}",
            "final TV": f"{r.tv_mean:.4g} ± {r.tv_std:.2g}",
            "floor KL": f"{r.floor_kl_mean:.4g}",
            "iterations": r.iterations,
            "t_end": f"{r.t_end:.4g}",
        }
        for r in table.itertuples()
    ]
    sections = [
        ("Final values at t_max (mean ± std over seeds)", markdown_table(rows)),
        (
            "Paths and settings",
            "\n".join(f"- `{t}`: {dict(r)}" for t, r in runs.items()) + f"\n- drifts: {params['drift']}",
        ),
    ]
    if imaging:
        sections.append(
            ("Imaging: inpainting with a diffusion prior (PSNR in dB)", markdown_table(imaging_rows(imaging)))
        )
    lims = limitations(scale, runs)
    return Report(
        title="Time-inhomogeneous Langevin diffusions: annealing paths on Gaussian mixtures",
        summary=(
            f"Euler-Maruyama on the {params['grid']} grid ({GRID_TEXT[params['grid']]}) with tau(t) = {params['tau0']} exp(-t/T); "
            f"seeds {', '.join(map(str, seeds))}. Gated claims are measured on `{params['claim_target']}` at "
            f"T = {params['claim_T']}."
        ),
        claims=claims,
        sections=sections,
        figures=figures(curves, runs),
        tables=[Table("table_final", "Final KL and TV per target, path and horizon", table)],
        limitations=lims,
        metrics={
            "table": table.replace({np.nan: None}).to_dict(orient="records"),
            "imaging": list(imaging),
            "limitation": lims[1] if len(lims) > 1 else lims[0],
        },
    )
