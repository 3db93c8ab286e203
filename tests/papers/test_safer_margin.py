"""tools/diagnose/safer_margin.py (issue 54): the helpers that take SAFER's AUROC deficit, routing and forgetting apart."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "diagnose"))
import safer_margin  # noqa: E402

from paperflow.safer.metrics import auroc, average_forgetting  # noqa: E402


def _stage(rng: np.random.Generator, n: int = 120):
    task = rng.integers(0, 4, n)
    score = rng.normal(size=n) - 0.7 * task + rng.integers(0, 3, n) * 0.5  # ties and overlap on purpose
    known, unknown = task <= 1, task >= 2
    return score, task, known, unknown


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pair_deficits_sum_to_the_pooled_deficit(seed):
    score, task, known, unknown = _stage(np.random.default_rng(seed))
    parts = safer_margin.pair_deficits(score, task, known, unknown)
    assert set(parts) == {(0, 2), (0, 3), (1, 2), (1, 3)}
    pooled = roc_auc_score(np.r_[np.ones(known.sum()), np.zeros(unknown.sum())], np.r_[score[known], score[unknown]])
    assert sum(parts.values()) == pytest.approx(1.0 - pooled, abs=1e-12)
    # one pair's share: its own deficit weighted by its share of the (known, unknown) pairs
    k0, u3 = known & (task == 0), unknown & (task == 3)
    share = k0.sum() * u3.sum() / (known.sum() * unknown.sum())
    assert parts[(0, 3)] == pytest.approx(share * (1.0 - auroc(score[k0], score[u3])))


def test_per_task_auroc_sides():
    score, task, known, unknown = _stage(np.random.default_rng(3))
    out = safer_margin.per_task_auroc(score, task, known, unknown)
    assert set(out) == {("known", 0), ("known", 1), ("unknown", 2), ("unknown", 3)}
    assert out[("known", 1)] == pytest.approx(auroc(score[known & (task == 1)], score[unknown]))
    assert out[("unknown", 2)] == pytest.approx(auroc(score[known], score[unknown & (task == 2)]))
    # a perfect separation of one pair shows as 1 on its side
    score = np.where(known, 1.0, 0.0)
    assert safer_margin.per_task_auroc(score, task, known, unknown)[("unknown", 3)] == 1.0


def test_group_argmin_routes_whole_groups_by_their_mean():
    values = np.array(
        [
            [0.0, 5.0, 1.0, 3.0, 0.0],  # expert 0
            [1.0, 0.0, 0.0, 0.0, 9.0],  # expert 1
        ]
    )
    groups = np.array([0, 0, 1, 1, -1])
    # group 0: means (2.5, 0.5) -> expert 1 for both nodes, though node 0 alone prefers expert 0;
    # group 1: means (2.0, 0.0) -> expert 1; the node of group -1 is routed alone (expert 0)
    assert safer_margin.group_argmin(values, groups).tolist() == [1, 1, 1, 1, 0]


def test_confusion_counts():
    mat = safer_margin.confusion(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 2, 1, 2, 2, 0]), 3, 3)
    assert mat.tolist() == [[1, 0, 1], [0, 1, 0], [1, 0, 2]]
    assert mat.sum() == 6


def test_forgetting_breakdown_matches_average_forgetting():
    rng = np.random.default_rng(4)
    k, n = 4, 200
    task = rng.integers(0, k, n)
    labels = task * 2 + rng.integers(0, 2, n)
    test = rng.random(n) < 0.7
    preds, routes = [], []
    for _ in range(k):  # per stage: a node keeps its label unless routed away, at a rate growing with the stage
        routed = np.where(rng.random(n) < 0.05 * (len(preds) + 1), rng.integers(0, k, n), task)
        routes.append(routed)
        preds.append(np.where(routed == task, labels, routed * 2))
    rows = safer_margin.forgetting_breakdown(preds, routes, labels, task, test)
    assert [r.task for r in rows] == list(range(k - 1))
    acc = np.full((k, k), np.nan)
    for stage in range(k):
        for j in range(stage + 1):
            nodes = test & (task == j)
            acc[stage, j] = np.mean(preds[stage][nodes] == labels[nodes])
    for r in rows:
        assert r.acc_last - r.acc_own == pytest.approx((r.gained - r.lost) / r.n)
        assert sum(r.taken_by.values()) == r.lost == sum(r.lost_classes.values())
        assert all(t != r.task for t in r.taken_by)  # a lost node was routed away (the expert itself is frozen)
    assert np.mean([r.acc_last - r.acc_own for r in rows]) == pytest.approx(average_forgetting(acc))


def test_add_counts():
    assert safer_margin.add_counts([{4: 2}, {}, {4: 1, 3: 5}]) == {4: 3, 3: 5}
