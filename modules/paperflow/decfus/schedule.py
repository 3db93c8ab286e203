"""The phase control of DecFus (spec §2.2 step 4): the neighbour-loss-variance stability detector
and the sigmoid threshold schedule (the code's "Eq. 6")."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def threshold_at(progress: float, theta0: float, theta1: float, steepness: float, midpoint: float) -> float:
    """Eq. 6: θ = θ0 − σ(k (p − m)) (θ0 − θ1); p is not clipped."""
    return theta0 - sigmoid(steepness * (progress - midpoint)) * (theta0 - theta1)


def descent_progress(round_: int, stable_round: int, rounds: int, kappa: float) -> float:
    """p = (r − t_s) / (κ R), both rounds in communication rounds."""
    return (round_ - stable_round) / (kappa * rounds)


@dataclass(frozen=True)
class DetectorSteps:
    """The detector's windows in evaluation steps u = r / test_round (the code's int() conversions)."""

    protection: int
    ref_start: int
    ref_end: int

    @classmethod
    def from_ratios(
        cls, rounds: int, test_round: int, protection: float, ref_start: float, ref_end: float
    ) -> DetectorSteps:
        return cls(
            int(rounds * protection / test_round),
            int(rounds * ref_start / test_round),
            int(rounds * ref_end / test_round),
        )


@dataclass
class StabilityDetector:
    """Flags the step at which one client's neighbour loss variance V_i stops moving: the std of the
    last `window` values, relative to the mean of V_i over the reference steps, drops below `ratio`.
    Never during protection; once stable, stable for good."""

    window: int
    ratio: float
    steps: DetectorSteps
    floor: float = 1e-6
    history: deque = field(init=False)
    reference_values: list[float] = field(default_factory=list)
    reference: float | None = None
    stable_step: int | None = None

    def __post_init__(self) -> None:
        self.history = deque(maxlen=self.window)

    @property
    def is_stable(self) -> bool:
        return self.stable_step is not None

    def update(self, variance: float, step: int) -> bool:
        """Feed V_i at evaluation step `step`; return whether the client is stable now."""
        self.history.append(float(variance))
        if self.steps.ref_start <= step <= self.steps.ref_end:
            self.reference_values.append(float(variance))
        if self.reference is None and step > self.steps.ref_end:
            # no value in the reference window (very short runs): fall back to the history so far
            values = self.reference_values or list(self.history)
            self.reference = max(float(np.mean(values)), self.floor)
        if step < self.steps.protection:
            return False
        if self.is_stable:
            return True
        ratio = self.relative_stability()
        if ratio < self.ratio:
            self.stable_step = step
            return True
        return False

    def relative_stability(self) -> float:
        """std(window) / reference mean; inf until the window is full and the reference is set."""
        if len(self.history) < self.window or self.reference is None:
            return math.inf
        return float(np.std(list(self.history))) / self.reference


def client_threshold(
    detector: StabilityDetector,
    round_: int,
    rounds: int,
    test_round: int,
    theta0: float,
    theta1: float,
    steepness: float,
    midpoint: float,
    kappa: float,
) -> float:
    """θ_i for the next fusions: θ0 before stability, Eq. 6 after it (t_s = stable step × test_round)."""
    if not detector.is_stable:
        return theta0
    p = descent_progress(round_, detector.stable_step * test_round, rounds, kappa)
    return threshold_at(p, theta0, theta1, steepness, midpoint)
