"""paperflow.core.curves.range_auc: closed forms and scipy's trapezoid."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import trapezoid

from paperflow.core.curves import range_auc


def test_a_constant_curve_has_its_height_and_a_ramp_its_mean():
    assert range_auc([0, 10, 30], [0.4, 0.4, 0.4]) == pytest.approx(0.4)
    assert range_auc([0, 50, 100], [0.0, 0.5, 1.0]) == pytest.approx(0.5)
    assert range_auc([100, 300], [0.2, 0.6]) == pytest.approx(0.4)  # the range, not the last step, divides


def test_it_agrees_with_scipy_on_uneven_steps():
    rng = np.random.default_rng(0)
    x = np.cumsum(rng.uniform(1, 20, size=12))
    y = rng.uniform(size=12)
    assert range_auc(x, y) == pytest.approx(trapezoid(y, x) / (x[-1] - x[0]), rel=1e-12)


def test_too_few_points_are_nan_and_bad_steps_are_refused():
    assert math.isnan(range_auc([5], [0.3]))
    with pytest.raises(ValueError, match="ascending"):
        range_auc([0, 2, 1], [0, 0, 0])
    with pytest.raises(ValueError, match="one length"):
        range_auc([0, 1], [0, 1, 2])
