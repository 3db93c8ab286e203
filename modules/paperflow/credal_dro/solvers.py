"""Open convex solvers only: every cvxpy problem here names its solver, and a missing one fails loudly."""

from __future__ import annotations

import cvxpy as cp

OPEN_SOLVERS = ("CLARABEL", "HIGHS")


def solve(problem: cp.Problem, solver: str) -> float:
    """Solve `problem` with the open solver `solver` (Clarabel for SOCP/exp-cone/LP, HiGHS for LP);
    raise with the solver's status when no optimum was found."""
    if solver not in OPEN_SOLVERS:
        raise ValueError(
            f"solver {solver!r} is not one of the open solvers {OPEN_SOLVERS}; commercial solvers are never used"
        )
    if solver not in cp.installed_solvers():
        raise RuntimeError(
            f"solver {solver} is not installed in this environment (cvxpy sees {cp.installed_solvers()}); "
            f"install {'clarabel' if solver == 'CLARABEL' else 'highspy'}"
        )
    problem.solve(solver=solver)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise RuntimeError(f"{solver} returned status {problem.status}")
    return float(problem.value)
