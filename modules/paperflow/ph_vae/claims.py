"""ph_vae's claims, tables, figures and report, computed from the evaluation metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import frames as frames_lib
from paperflow.core import plots
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table
from paperflow.ph_vae.plots import qq, survival_curves

LABELS = {"gauss": "Gaussian", "student_t": "Student-t", "gev": "GEV", "ph": "PH", "ph_indep": "PH per coordinate"}
FOLLOW_UP = "follow-up paper (arXiv 2605.18931): PH reduces tail KS up to x6 and extreme-quantile error up to x10 vs Gaussian on Pareto data"


def per_seed(metrics: pd.DataFrame, decoder: str, metric: str, dim: int, seeds: Sequence[int]) -> list[float]:
    """The metric of `decoder` for each seed, in seed order; NaN where a seed has no value."""
    return frames_lib.per_seed(metrics, seeds, decoder=decoder, metric=metric, dim=dim)


def tail_claims(
    metrics: pd.DataFrame,
    dataset: str,
    rivals: Sequence[str],
    seeds: Sequence[int],
    tail_q: float,
    gated_rival: str | None,
) -> list[Claim]:
    """PH against each rival on tail KS and Q99 error of dim 0; only the claim against `gated_rival` is gated."""
    ks = f"ks_tail@{tail_q:g}"
    claims = []
    for metric, what in ((ks, f"tail KS@{tail_q:g}"), ("q99_rel", "Q99 relative error")):
        for rival in rivals:
            gated = rival == gated_rival
            claims.append(
                compare_claim(
                    id=f"{metric.split('@')[0]}_ph_lt_{rival}_{dataset}",
                    statement=f"{dataset}: PH-VAE has lower {what} than the {LABELS[rival]} VAE (mean over seeds)",
                    values=per_seed(metrics, "ph", metric, 0, seeds),
                    threshold_values=per_seed(metrics, rival, metric, 0, seeds),
                    seeds=seeds,
                    comparison="<",
                    gated=gated,
                    paper_value=FOLLOW_UP if gated else None,
                )
            )
    return claims


DEPENDENCE = {
    "coexc_abs_err@0.95": ("coexc", "co-exceedance error at q = 0.95"),
    "kendall_tau_mae": ("kendall", "Kendall tau error"),
}


def dependence_claims(
    metrics: pd.DataFrame, dataset: str, rival: str, seeds: Sequence[int], metrics_compared: Sequence[str]
) -> list[Claim]:
    """Spec §7 (rival gauss) and the spec-3 ablation (rival ph_indep, which should lose the dependence): on a
    multivariate set, PH's dependence errors against the rival's, reported only (the spec gates neither)."""
    return [
        compare_claim(
            id=f"{DEPENDENCE[metric][0]}_ph_lt_{rival}_{dataset}",
            statement=(
                f"{dataset}: PH-VAE has lower {DEPENDENCE[metric][1]} than the {LABELS[rival]} VAE (reported only)"
            ),
            values=per_seed(metrics, "ph", metric, -1, seeds),
            threshold_values=per_seed(metrics, rival, metric, -1, seeds),
            seeds=seeds,
            comparison="<",
            gated=False,
        )
        for metric in metrics_compared
    ]


def build_claims(
    frames: Mapping[str, pd.DataFrame],
    claim_dataset: str,
    decoders: Mapping[str, Sequence[str]],
    seeds: Sequence[int],
    tail_q: float,
) -> list[Claim]:
    """Spec §7: gated, PH beats Gaussian on tail KS and Q99 error on the claim dataset; reported, PH
    against the other baselines there, against Gaussian on the other 1-D sets, co-exceedance against
    Gaussian on the multivariate sets, and there co-exceedance and Kendall tau against the `ph_indep`
    ablation where it runs. `decoders` maps each dataset to the decoders trained on it."""
    for name in frames:
        if "ph" not in decoders[name] or "gauss" not in decoders[name]:
            raise ValueError(f"the ph_vae claims compare 'ph' with 'gauss'; {name} has {list(decoders[name])}")
    rivals = [d for d in decoders[claim_dataset] if d != "ph"]
    claims = tail_claims(frames[claim_dataset], claim_dataset, rivals, seeds, tail_q, gated_rival="gauss")
    for name, frame in frames.items():
        if name == claim_dataset:
            continue
        if frame.dim.max() == 0:
            claims += tail_claims(frame, name, ["gauss"], seeds, tail_q, gated_rival=None)
            continue
        claims += dependence_claims(frame, name, "gauss", seeds, ["coexc_abs_err@0.95"])
        if "ph_indep" in decoders[name]:
            claims += dependence_claims(frame, name, "ph_indep", seeds, list(DEPENDENCE))
    return claims


def summary_table(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean and std over seeds of every metric, per dataset, decoder and dim."""
    long = pd.concat([f.assign(dataset=name) for name, f in frames.items()], ignore_index=True)
    return frames_lib.seed_summary(long, ["dataset", "decoder", "dim", "metric"])


def headline_rows(table: pd.DataFrame, metrics: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for (dataset, decoder, dim), group in table.groupby(["dataset", "decoder", "dim"], sort=True):
        values = dict(zip(group.metric, zip(group["mean"], group["std"])))
        if not any(m in values for m in metrics):
            continue
        row: dict[str, Any] = {
            "dataset": dataset,
            "decoder": LABELS.get(decoder, decoder),
            "dim": "joint" if dim < 0 else dim,
        }
        for m in metrics:
            mean, std = values.get(m, (np.nan, np.nan))
            row[m] = f"{mean:.4g} ± {std:.2g}" if np.isfinite(mean) else "n/a"
        rows.append(row)
    return rows


def figures(
    samples: Mapping[str, pd.DataFrame],
    tests: Mapping[str, np.ndarray],
    histories: pd.DataFrame,
    decoders: Mapping[str, Sequence[str]],
    seed: int,
) -> list[Figure]:
    """Survival and QQ panels per dataset and dim, and the training loss, for the decoders of each dataset."""
    names = list(samples)
    out = []
    for key, caption, draw in (
        ("figure_tail", "Tail survival functions above the data's 0.9 quantile", survival_curves),
        ("figure_qq", "QQ plot of model against test-data quantiles (0.5 to 0.999)", qq),
    ):
        panels = [(n, j) for n in names for j in range(tests[n].shape[1])]
        fig, axes = plots.subplots(len(panels))
        for ax, (name, j) in zip(axes, panels):
            frame = samples[name]
            model = {
                LABELS[d]: frame[(frame.decoder == d) & (frame.seed == seed)][f"x{j}"].to_numpy()
                for d in decoders[name]
            }
            draw(ax, model, tests[name][:, j], f"{name} dim {j} (seed {seed})")
        out.append(Figure(key, caption, fig))
    fig, axes = plots.subplots(len(names))
    for ax, name in zip(axes, names):
        part = histories[histories.dataset == name]
        for decoder in decoders[name]:
            curve = part[part.decoder == decoder].groupby("epoch")["loss"].mean()
            ax.plot(curve.index, curve.to_numpy(), label=LABELS[decoder])
        ax.set_xlabel("epoch")
        ax.set_ylabel("negative ELBO (train, mean over seeds)")
        ax.set_title(name)
        ax.legend(fontsize=7)
    return [*out, Figure("figure_loss", "Training loss per epoch", fig)]


ABLATION = (
    " `PH per coordinate` is the `ph_indep` ablation (one 1-D PH-VAE per coordinate, independent latents);"
    " it runs on the multivariate sets only, since on 1-D data it is the PH-VAE itself."
)
LIMITATIONS = [
    "Smoke scale trains 2-D latents with 8 phases for 15 epochs on 5,000 points; the paper uses 10-D latents, 15 phases and 100 epochs.",
    "Only synthetic data from the true laws: the Danish, word-frequency and 5-D/10-D results need `scale=paper`.",
    "PH laws are light-tailed asymptotically: the tail metrics look at the finite range covered by the samples (q up to 0.99).",
    "Gaussian and Student-t decoders may put samples below zero on positive data; they are kept (not clipped): KS_tail only looks above the true 0.95 quantile.",
]


def build_report(
    *,
    frames: Mapping[str, pd.DataFrame],
    samples: Mapping[str, pd.DataFrame],
    tests: Mapping[str, np.ndarray],
    histories: pd.DataFrame,
    params: Mapping[str, Any],
) -> Report:
    decoders = {name: list(ds) for name, ds in params["decoders"].items()}
    seeds = list(params["seeds"])
    every_decoder = list(dict.fromkeys(d for ds in decoders.values() for d in ds))
    claims = build_claims(frames, params["claim_dataset"], decoders, seeds, params["tail_q"])
    table = summary_table(frames)
    ks = f"ks_tail@{params['tail_q']:g}"
    kl_rows = headline_rows(table, ["test_kl", "test_nelbo_per_dim"])
    sections = [
        (
            "Tail metrics (mean ± std over seeds)",
            markdown_table(headline_rows(table, [ks, "q99_rel", "q95_rel", "neg_frac"])),
        ),
        (
            "Dependence (multivariate sets)",
            markdown_table(
                headline_rows(
                    table,
                    [
                        "coexc_abs_err@0.95",
                        "coexc_real@0.95",
                        "coexc_gen@0.95",
                        "kendall_tau_mae",
                        "corr_log1p_frobenius",
                    ],
                )
            ),
        ),
        ("Test ELBO and KL (KL near 0 means the decoder acts as one fitted law)", markdown_table(kl_rows)),
        ("Data", "\n".join(f"- `{n}`: {spec}" for n, spec in params["dataset_specs"].items())),
    ]
    return Report(
        title="PH-VAE: phase-type decoders for heavy-tailed data",
        summary=(
            f"Decoders {', '.join(LABELS[d] for d in every_decoder)} share the encoder, latent prior and training; "
            f"seeds {', '.join(map(str, seeds))}. Gated claims are measured on `{params['claim_dataset']}`."
            + (ABLATION if "ph_indep" in every_decoder else "")
        ),
        claims=claims,
        sections=sections,
        figures=figures(samples, tests, histories, decoders, seeds[0]),
        tables=[Table("table_tail", "Every metric: mean, std and number of seeds", table)],
        limitations=LIMITATIONS,
        metrics={"table": table.replace({np.nan: None}).to_dict(orient="records"), "limitation": LIMITATIONS[0]},
    )
