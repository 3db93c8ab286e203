"""What st_gfn's report says of the adversarial games: the metrics of a game env, the games' table section and
the figure of optimal moves over training (the reported directions against TB are claims of config/st_gfn.yaml)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from paperflow.core import plots
from paperflow.core.report import Figure
from paperflow.st_gfn.settings import GAME_METRICS  # noqa: F401  (re-exported for the report)


def game_figure(histories: pd.DataFrame, env_methods: Mapping[str, Sequence[str]]) -> Figure:
    """Fraction of reference positions whose argmax move is optimal, over training (mean over seeds)."""
    envs = [
        e
        for e in env_methods
        if "optimal_argmax" in histories and histories[histories.env == e]["optimal_argmax"].notna().any()
    ]
    fig, axes = plots.subplots(max(len(envs), 1))
    if not envs:
        axes[0].text(0.5, 0.5, "no game env in this run", ha="center", va="center")
        axes[0].set_axis_off()
    for ax, name in zip(axes, envs):
        part = histories[(histories.env == name) & histories["optimal_argmax"].notna()]
        for method in env_methods[name]:
            curve = part[part.method == method].groupby("iteration")["optimal_argmax"].mean()
            ax.plot(curve.index, curve.to_numpy(), marker=".", label=method)
        ax.set_xlabel("iteration")
        ax.set_ylabel("optimal argmax moves (fraction of positions)")
        ax.set_title(name)
        ax.legend(fontsize=7)
    return Figure("figure_games", "Games: fraction of optimal argmax moves over training", fig)
