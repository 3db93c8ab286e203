"""The workflow text may change; the jobs it plans may not, unless a change means to move them. Every paper's dry
run at every scale (rule, wildcards, named inputs, outputs and logs, benchmark, conda env, script, params with the
code hash left out, threads, resources) equals the snapshot in tests/data/plans/, which `tools/plan_snapshot.py`
writes (rerun it, and say so in the commit, only for a change that means to move jobs)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from paperflow.core.config import SCALES, available_papers
from paperflow.core.jobtable import first_difference, plan_of, without_code_hash

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scale", SCALES)
def test_every_scale_plans_the_snapshot_jobs(scale):
    with gzip.open(ROOT / "tests" / "data" / "plans" / f"{scale}.json.gz", "rt") as fh:
        snapshot = json.load(fh)
    now = without_code_hash(plan_of(ROOT, scale, available_papers(ROOT)))
    difference = first_difference(snapshot, now)
    assert difference is None, f"scale {scale}: {difference} (tools/plan_snapshot.py rewrites the snapshot)"


def test_a_moved_job_is_named():
    job = {"rule": "x_train", "wildcards": {"seed": "0"}, "output": {"files": ["a"], "names": {}}, "threads": 1}
    assert first_difference([job], [job]) is None
    assert "threads was 1, now 2" in first_difference([job], [{**job, "threads": 2}])
    assert "is new" in first_difference([job], [job, {**job, "wildcards": {"seed": "1"}}])
    assert "planned no more" in first_difference([job], [])
