"""ph_vae's tail plots: survival functions on log-log axes and QQ plots against the test data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np

from paperflow.core import plots  # noqa: F401 (selects the headless backend before pyplot is used)


def survival_curves(
    ax, samples: Mapping[str, np.ndarray], reference: np.ndarray, title: str, q_from: float = 0.9
) -> None:
    """Empirical survival functions on log-log axes above the reference's q_from quantile; the x range
    stops at 10x the reference's maximum so that one wild model does not flatten the others."""
    lo = np.quantile(reference, q_from)
    for label, x in {"data (test)": reference, **samples}.items():
        xs = np.sort(x[x > lo])
        if xs.size == 0:
            continue
        surv = (1.0 - np.arange(xs.size) / xs.size) * np.mean(x > lo)
        ax.loglog(
            xs,
            surv,
            lw=2.2 if label.startswith("data") else 1.3,
            color="black" if label.startswith("data") else None,
            label=label,
        )
    ax.set_xlim(lo, 10 * float(np.max(reference)))
    ax.set_xlabel("x")
    ax.set_ylabel("P(X > x)")
    ax.set_title(title)
    ax.legend(fontsize=7)


def qq(
    ax, samples: Mapping[str, np.ndarray], reference: np.ndarray, title: str, probs: Sequence[float] | None = None
) -> None:
    """Model quantiles against the reference's quantiles, with the identity line; y stops at 10x the
    reference's largest quantile (a model beyond it runs off the top)."""
    probs = np.asarray(probs if probs is not None else np.linspace(0.5, 0.999, 60))
    ref_q = np.quantile(reference, probs)
    for label, x in samples.items():
        ax.plot(ref_q, np.quantile(x, probs), ".-", ms=3, lw=1, label=label)
    ax.plot(ref_q, ref_q, "k--", lw=1, label="identity")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=max(float(ref_q.min()), 1e-3))
    ax.set_ylim(-float(ref_q.max()), 10 * float(ref_q.max()))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("data quantile")
    ax.set_ylabel("model quantile")
    ax.set_title(title)
    ax.legend(fontsize=7)
