"""A job requeued by SLURM mid-run resumes from its checkpoint folder (paperflow.core.resume) on the test cluster of
tests/cluster/slurm.sh: a one-rule workflow through profiles/slurm-ci with `--slurm-requeue` (what profiles/slurm
sets) writes rows to a RowJournal; the test requeues the running job with `scontrol requeue` (what SLURM does to a
preempted job), and the Snakemake run still succeeds, the second start skipping the rows the first one wrote.

Skipped without a SLURM controller, as tests/cluster/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, WORKER_THREAD_VARS, snakemake_bin
from test_slurm import _accounting, _cancel_leftovers, _cluster_problem

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]

ROWS = 8

SNAKEFILE = f"""
rule gen:
    output:
        "results/rows.jsonl",
    log:
        "logs/gen.log",
    params:
        n={ROWS},
        code={{"generated_roots": ["results", "resources"]}},
    resources:
        runtime=5,
        mem_mb=200,
    script:
        "gen.py"
"""

SCRIPT = f"""
import json, os, sys, time
sys.path.insert(0, {str(ROOT / "modules")!r})
from paperflow.core.job import snakemake_job
from paperflow.core.resume import RowJournal

with snakemake_job(snakemake) as job:
    folder = job.checkpoint_dir()
    with RowJournal(folder / "rows.jsonl") as journal:
        with open("starts.txt", "a") as fh:
            start = {{"done": len(journal), "job": os.environ.get("SLURM_JOB_ID"), "folder": str(folder)}}
            fh.write(json.dumps(start) + "\\n")
        ids = list(range(job.params.n))
        for i in journal.todo(ids, key=lambda i: i):
            time.sleep(1.5)
            journal.append({{"id": i, "text": f"row {{i}}"}})
        rows = journal.complete(ids)
    with open(job.output[0], "w") as fh:
        fh.writelines(json.dumps(r) + "\\n" for r in rows)
"""


def _starts(work: Path) -> list[dict]:
    path = work / "starts.txt"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rows_done(work: Path, start: dict) -> int:
    path = work / start["folder"] / "rows.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_requeued_job_resumes_from_its_checkpoint(tmp_path):
    problem = _cluster_problem()
    if problem is None and not _accounting():
        # the executor learns a requeued job's end from sacct; without slurmdbd it waits for ever (seen when
        # this machine's MariaDB was killed under a running cluster: a 420 s timeout instead of a reason)
        problem = "sacct does not answer (slurmdbd or its MariaDB is down); `bash tests/cluster/slurm.sh up`"
    if problem:
        if os.environ.get("PAPERFLOW_REQUIRE_SLURM") == "1":
            pytest.fail(f"PAPERFLOW_REQUIRE_SLURM=1 but: {problem}")
        pytest.skip(problem)
    work = tmp_path / "work"
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    (work / "gen.py").write_text(SCRIPT)
    shutil.copytree(ROOT / "profiles" / "slurm-ci", work / "profiles" / "slurm-ci")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    for var in WORKER_THREAD_VARS:
        env.pop(var, None)
    args = [snakemake_bin(), "--profile", "profiles/slurm-ci", "--slurm-requeue", "--jobs", "1"]
    proc = subprocess.Popen(args, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 180
        while not (_starts(work) and _rows_done(work, _starts(work)[0]) >= 3):
            assert proc.poll() is None, f"snakemake ended before the requeue:\n{proc.stdout.read()[-4000:]}"
            assert time.monotonic() < deadline, "the job wrote no rows in 180 s"
            time.sleep(0.5)
        first = _starts(work)[0]
        requeue = subprocess.run(["scontrol", "requeue", first["job"]], capture_output=True, text=True)
        assert requeue.returncode == 0, requeue.stderr
        output, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            proc.kill()
        _cancel_leftovers(work)
    assert proc.returncode == 0, output[-4000:]
    starts = _starts(work)
    assert len(starts) == 2, (starts, output[-3000:])
    second = starts[1]
    assert second["job"] == first["job"]  # the same SLURM job, requeued
    assert 3 <= second["done"] < ROWS  # it started from the rows written before the requeue
    rows = [json.loads(line) for line in (work / "results" / "rows.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(ROWS))
    assert not (work / first["folder"]).exists()  # removed when the job succeeded
