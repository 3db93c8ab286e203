"""Metrics of learning curves that several papers' claims share.

`range_auc` is the area under a curve over its evaluated steps divided by their range (a curve's mean height, the
trapezoid rule between evaluations): eapo's accuracy AUC uses it. itpo's claims compute the same for greedy success
(`paperflow.itpo.claims.success_auc`) and move onto it with itpo's next cpu run, whose record a change of its report
job's code would stale."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def range_auc(steps: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid of `values` over `steps` (ascending), divided by the step range; NaN with fewer than two points."""
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"steps and values must be one-dimensional and of one length; got {x.shape} and {y.shape}")
    if len(x) < 2:
        return float("nan")
    if np.any(np.diff(x) <= 0):
        raise ValueError("steps must be strictly ascending")
    return float(np.trapezoid(y, x) / (x[-1] - x[0]))
