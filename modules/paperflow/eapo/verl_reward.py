"""DAPO's reward at paper scale, as a verl custom reward function file (`reward.custom_reward_function.path`, name
`compute_score`): the EAPO arms' own rule (math-verify on the last \\boxed{}, `paperflow.eapo.math_reward`), so
that every arm is scored alike. verl's default scorer for DAPO's data (`math_dapo`) reads an "Answer:" line instead,
which our prompt does not ask for. The DAPO reward manager adds the overlong penalty to `score`; `acc` is the
metric dynamic sampling filters on (algorithm.filter_groups.metric=acc).

verl loads this file by path in its reward workers, so it puts the package root on sys.path itself."""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from paperflow.eapo.math_reward import math_reward  # noqa: E402


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    """verl's reward-function signature; `data_source` is ours (recipes.DATA_SOURCE) for every row."""
    score = math_reward(str(solution_str), str(ground_truth))
    return {"score": score, "acc": score}
