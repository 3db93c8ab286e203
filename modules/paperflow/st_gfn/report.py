"""st_gfn's report: the metrics table of `claims` (judged by the claims of config/st_gfn.yaml when the report job
publishes it), the summary table, the direction and metric sections, the figures (terminal pmfs, training loss,
L1, games), the environment texts and the limitations, as a `paperflow.core.report.Report`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import frames as frames_lib
from paperflow.core import plots
from paperflow.core.report import Figure, Report, Table, fmt, markdown_table
from paperflow.st_gfn.claims import metrics_table
from paperflow.st_gfn.game_report import GAME_METRICS, game_figure
from paperflow.st_gfn.settings import GAMES


def summary_table(frames: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Mean, std and number of seeds of every metric, per env and method."""
    long = pd.concat([f.assign(env=name) for name, f in frames.items()], ignore_index=True)
    return frames_lib.seed_summary(long, ["env", "method", "metric"])


def headline_rows(table: pd.DataFrame, metrics: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for (env, method), group in table.groupby(["env", "method"], sort=True):
        values = dict(zip(group.metric, zip(group["mean"], group["std"])))
        if not any(m in values for m in metrics):
            continue
        row: dict[str, Any] = {"env": env, "method": method}
        for m in metrics:
            mean, std = values.get(m, (np.nan, np.nan))
            row[m] = f"{mean:.4g} ± {std:.2g}" if np.isfinite(mean) else "n/a"
        rows.append(row)
    return rows


def direction_rows(table: pd.DataFrame, claims: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Sign and size of each reported (ungated) claim against another method, from the long metrics table: the
    means over seeds and the relative difference (method - baseline) / baseline; the verdicts are in the claims."""
    rows = []
    for c in claims:
        if c.get("gated", True) or not isinstance(c.get("baseline"), str):
            continue
        part = table[table.metric == c["metric"]]
        mine, base = (part[part.method == m].value.mean() for m in (c["method"], c["baseline"]))
        rel = (mine - base) / abs(base) if base else float("nan")
        rows.append(
            {
                "claim": c["id"],
                "method": fmt(mine),
                "baseline": fmt(base),
                "relative difference": f"{rel:+.1%}" if np.isfinite(rel) else "n/a",
            }
        )
    return rows


def figures(
    pmfs: Mapping[str, pd.DataFrame],
    targets: Mapping[str, pd.DataFrame],
    histories: pd.DataFrame,
    table: pd.DataFrame,
    env_methods: Mapping[str, Sequence[str]],
) -> list[Figure]:
    env = next(iter(pmfs))
    cols = ["exact"] + list(env_methods[env]) + ["uniform"]
    fig, axes = plots.subplots(len(cols), width=2.6, height=2.6)
    xcols = [c for c in targets[env].columns if c.startswith("x")]
    coords = targets[env][xcols].to_numpy()
    for ax, col in zip(axes, cols):
        p = pmfs[env][col].to_numpy()
        if len(xcols) == 2:  # a 2-D grid: show the pmf as an image
            h = int(coords.max()) + 1
            grid = np.zeros((h, h))
            grid[coords[:, 0], coords[:, 1]] = p
            ax.imshow(grid, origin="lower", cmap="viridis")
        else:
            ax.plot(p)
        ax.set_title(f"{env}: {col}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    pmf = Figure("figure_pmfs", "Exact target and empirical terminal pmfs (first seed)", fig)
    envs = list(pmfs)
    fig, axes = plots.subplots(len(envs))
    for ax, name in zip(axes, envs):
        part = histories[histories.env == name]
        for method in env_methods[name]:
            curve = part[part.method == method].groupby("iteration")["loss"].mean()
            smooth = curve.rolling(20, min_periods=1).mean()
            ax.plot(smooth.index, smooth.to_numpy(), label=method)
        ax.set_yscale("log")
        ax.set_xlabel("iteration")
        ax.set_ylabel("training loss (mean over seeds, rolling 20)")
        ax.set_title(name)
        ax.legend(fontsize=7)
    loss = Figure("figure_loss", "Training loss per iteration", fig)
    l1_envs = [e for e in envs if ((table.env == e) & (table.metric == "l1")).any()]
    fig, axes = plots.subplots(len(l1_envs))
    for ax, name in zip(axes, l1_envs):
        part = table[(table.env == name) & (table.metric == "l1")].set_index("method")
        order = list(env_methods[name]) + ["uniform"]
        ax.bar(range(len(order)), part.loc[order, "mean"], yerr=part.loc[order, "std"].fillna(0), capsize=3)
        ax.set_xticks(range(len(order)), order, rotation=30, fontsize=7)
        ax.set_ylabel("L1 = mean |p_hat - pi| (mean ± std over seeds)")
        ax.set_title(name)
    l1 = Figure("figure_l1", "L1 to the exact target per method", fig)
    return [pmf, loss, l1, game_figure(histories, env_methods)]


def env_text(name: str, spec: Mapping[str, Any]) -> str:
    if spec["kind"] == "hypergrid":
        return f"`{name}` a {spec['ndim']}-D HyperGrid of {spec['height'] ** spec['ndim']:,} states"
    if spec["kind"] == "bitseq":
        return f"`{name}` {spec['seq_size']}-bit sequences of {spec['word_size']}-bit words ({spec['n_modes']} reference modes)"
    if spec["kind"] in GAMES:
        return f"`{name}` {spec['kind']} self-play ({spec['iterations']} iterations of {spec['batch_size']} games)"
    return f"`{name}` {spec['k']}-gene sets ({spec['source']} data)"


def env_texts(env_specs: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """env_text of the GFlowNet envs and of the games, apart."""
    flows = [env_text(n, s) for n, s in env_specs.items() if s["kind"] not in GAMES]
    games = [env_text(n, s) for n, s in env_specs.items() if s["kind"] in GAMES]
    return flows, games


def missing_tasks(env_specs: Mapping[str, Mapping[str, Any]]) -> str:
    """Which of the paper's task families this run leaves out."""
    kinds = {s["kind"] for s in env_specs.values()}
    real_cells = any(s["kind"] == "geneset" and s["source"] == "geo" for s in env_specs.values())
    missing = []
    if not kinds & set(GAMES):
        missing.append("the adversarial games (`tictactoe`, `connect4`, run at scale=paper)")
    elif "connect4" not in kinds:
        missing.append("Connect-4 (`connect4`, run at scale=paper)")
    if "bitseq" not in kinds:
        missing.append("noisy sequence generation (`bitseq`, run at scale=paper)")
    if not real_cells:
        missing.append(
            "the single-cell perturbation task on the real GSE133344 data (`geneset`, scale=paper)"
            + ("; this run's gene sets come from the seeded synthetic_norman stand-in" if "geneset" in kinds else "")
        )
    return "Not in this run: " + "; ".join(missing) + " (see the README)."


def limitations(scale: str, env_specs: Mapping[str, Mapping[str, Any]], train: Mapping[str, Any]) -> list[str]:
    lines = [
        "The paper, its authors and its code were not found: the spectral loss, the time features and the "
        "Wiener-Khinchin intrinsic reward are the spec's reconstruction [R], not the authors' method."
    ]
    if scale != "paper":
        flows, games = env_texts(env_specs)
        lines.append(
            f"Scale `{scale}` trains on {', '.join(flows)} for {train['iterations']} iterations of "
            f"{train['batch_size']} trajectories"
            + (f", and on {', '.join(games)}" if games else "")
            + ", smaller than `scale=paper`."
        )
    if any(s["kind"] == "geneset" for s in env_specs.values()):
        lines.append(
            "The gene-set reward is a reconstructed proxy [R] (additive single-gene shifts against one measured "
            "double perturbation); the paper's single-cell reward is unknown."
        )
    return lines + [
        missing_tasks(env_specs),
        "L1 is torchgfn's convention (mean over states); TV = L1 * |X| / 2 is in the table.",
        "Loss standard deviations compare losses with different units across methods.",
    ]


def proxy_text(meta: Mapping[str, Any]) -> str:
    proxy = meta["proxy"]
    return (
        f"target double perturbation {proxy['target']}; {len(proxy['genes'])} genes with single perturbations, "
        f"{len(proxy['response_genes'])} response genes; Pearson r of the additive prediction against the "
        f"{proxy['n_doubles']} measured doubles = {fmt(proxy['additive_r'])}"
    )


def build_report(
    *,
    frames: Mapping[str, pd.DataFrame],
    pmfs: Mapping[str, pd.DataFrame],
    targets: Mapping[str, pd.DataFrame],
    histories: pd.DataFrame,
    params: Mapping[str, Any],
    scale: str,
    target_meta: Mapping[str, Mapping[str, Any]] | None = None,
) -> Report:
    target_meta = dict(target_meta or {})
    seeds, env_methods = list(params["seeds"]), dict(params["env_methods"])
    kinds = {e: spec["kind"] for e, spec in params["env_specs"].items()}
    long = metrics_table(frames, scale)
    table = summary_table(frames)
    sections = [
        ("Paper's direction: sign and size", markdown_table(direction_rows(long, params.get("claims") or []))),
        (
            "Distribution metrics (mean ± std over seeds)",
            markdown_table(headline_rows(table, ["l1", "tv", "jsd", "l1_on_policy", "logz_abs_err"])),
        ),
        (
            "Modes, stability, sample efficiency (mean ± std over seeds)",
            markdown_table(headline_rows(table, ["modes_found", "modes_total", "loss_std_last", "trajectories_to_l1"])),
        ),
        *(
            [
                (
                    "Sequence tasks: top-k reward and diversity (mean ± std over seeds)",
                    markdown_table(headline_rows(table, ["topk_reward", "topk_diversity"])),
                )
            ]
            if "topk_reward" in set(table.metric)
            else []
        ),
        *(
            [
                (
                    "Adversarial games: optimal moves and results against fixed opponents (mean ± std over seeds)",
                    markdown_table(headline_rows(table, GAME_METRICS)),
                )
            ]
            if "optimal_sampled" in set(table.metric)
            else []
        ),
        *(
            [
                (
                    "Gene-set proxy",
                    "\n".join(f"- `{e}`: {proxy_text(meta)}" for e, meta in target_meta.items() if "proxy" in meta),
                )
            ]
            if any("proxy" in meta for meta in target_meta.values())
            else []
        ),
        ("Environments", "\n".join(f"- `{n}`: {spec}" for n, spec in params["env_specs"].items())),
        ("Methods", "\n".join(f"- `{n}`: {spec}" for n, spec in params["method_specs"].items())),
    ]
    lims = limitations(scale, params["env_specs"], params["train"])
    flow_texts, game_texts = env_texts(params["env_specs"])
    return Report(
        title="ST-GFN: spectral time-dependent GFlowNets (reconstructed) vs TB, DB, SubTB",
        summary=(
            f"torchgfn environments with log-space reward noise: {'; '.join(flow_texts)}"
            + (f"; two-player games on the project's engines: {'; '.join(game_texts)}" if game_texts else "")
            + f". Methods per env {env_methods}; "
            f"seeds {', '.join(map(str, seeds))}. On enumerable envs L1 uses the last "
            f"{params['evaluate']['last_visited']} visited terminal states against the exact pi = R / Z and "
            f"`l1_on_policy` {params['evaluate']['n_eval_samples']} fresh samples of the trained sampler "
            f"(epsilon = 0)."
            + (
                f" On sequence envs modes found and top-{params['evaluate']['top_k']} reward use every visited "
                f"sequence."
                if "bitseq" in kinds.values()
                else ""
            )
        ),
        table=long,
        sections=sections,
        figures=figures(pmfs, targets, histories, table, env_methods),
        tables=[Table("table_metrics", "Every metric per env and method: mean, std and number of seeds", table)],
        limitations=lims,
        metrics={"table": table.replace({np.nan: None}).to_dict(orient="records"), "limitation": lims[0]},
    )
