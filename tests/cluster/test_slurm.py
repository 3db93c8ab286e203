"""ph_vae at tiny scale through the real SLURM executor, on the test cluster of tests/cluster/slurm.sh.

The copy's tiny config asks for one GPU per training job. Checked:
- the run succeeds and writes the report;
- inside each job (provenance records): training ran in partition `gpu` and saw CUDA_VISIBLE_DEVICES,
  every other job ran in `cpu` without any GPU variable;
- independently, from SLURM's own records (sacct, or squeue without accounting): a GPU was
  allocated to exactly the training jobs;
- a changed training hyperparameter resubmits only train, evaluate, report and summary.

Skipped when there is no SLURM client or controller (developer machines); set
PAPERFLOW_REQUIRE_SLURM=1 (CI) to make that a failure instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import copy_repo, job_counts, run_snakemake

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one cluster, one run

PROFILE = "profiles/slurm-ci"
ARGS = ("--profile", PROFILE, "--config", "scale=tiny", "papers=[ph_vae]")
GPU_RULES = {"ph_vae_train"}
TRAIN_RERUN = {"ph_vae_train", "ph_vae_evaluate", "ph_vae_report", "summary"}
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_GPUS")
# "Job 7 has been submitted with SLURM jobid 12 (log: .../slurm_logs/rule_ph_vae_train/pareto1d_ph/12.log)."
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: \S*?/slurm_logs/rule_([^/\s]+)/")


def _cmd(*args: str, timeout: int = 30) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def _cluster_problem() -> str | None:
    """Why the SLURM test cannot run here, or None."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no SLURM client (sinfo/sbatch not on PATH); start a test cluster with `bash tests/cluster/slurm.sh up`"
    try:
        ping = _cmd("scontrol", "ping", timeout=15)
        nodes = _cmd("sinfo", "-h", "-N", "-o", "%T", timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"SLURM controller not answering ({exc}); `bash tests/cluster/slurm.sh up`"
    if ping.returncode != 0 or "UP" not in ping.stdout:
        said = " ".join((ping.stdout + ping.stderr).split()[:8])
        return f"SLURM controller is not up (scontrol ping: {said}); `bash tests/cluster/slurm.sh up`"
    states = set(nodes.stdout.split())
    if not states & {"idle", "mixed", "allocated"}:
        return f"no usable SLURM node (sinfo states: {sorted(states) or 'none'}); `bash tests/cluster/slurm.sh up`"
    parts = set(_cmd("sinfo", "-h", "-o", "%R").stdout.split())
    if not {"cpu", "gpu"} <= parts:
        return f"the cluster lacks partitions cpu and gpu (has {sorted(parts)}): not the tests/cluster/slurm.sh cluster"
    return None


def _accounting() -> bool:
    """Whether sacct answers (slurmdbd); otherwise the test uses squeue (MinJobAge=300 keeps jobs)."""
    return _cmd("sacct", "-n", "-X", "-S", "now-1minutes", "--format=JobIdRaw").returncode == 0


def submitted(output: str) -> list[tuple[int, str]]:
    """(SLURM job id, rule) of every job this Snakemake run submitted, from its log."""
    return [(int(jobid), rule) for jobid, rule in SUBMITTED.findall(output)]


def slurm_records(jobids: list[int], accounting: bool) -> dict[int, dict[str, str]]:
    """SLURM's own view of the jobs: partition, allocated TRES, comment (the plugin's rule_<name>...)."""
    ids = ",".join(map(str, jobids))
    if accounting:
        proc = _cmd("sacct", "-n", "-X", "-P", "-j", ids, "--format=JobIdRaw,Partition,AllocTRES,Comment,State")
        fields = ("partition", "tres", "comment", "state")
    else:
        # without slurmdbd, tres-alloc lists gres/gpu only with AccountingStorageTRES=gres/gpu;
        # tres-per-job (gres:gpu:1) is what the job asked for and got
        proc = _cmd(
            "squeue",
            "-h",
            "--states=all",
            "-j",
            ids,
            "-O",
            "JobId:|,Partition:|,tres-alloc:|,Comment:|,State:|,tres-per-job:",
        )
        fields = ("partition", "tres", "comment", "state", "tres_per_job")
    assert proc.returncode == 0, proc.stderr
    records = {}
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 5 and parts[0].isdigit():
            rec = dict(zip(fields, parts[1:]))
            rec["gpus"] = "gres/gpu=1" in rec["tres"] or rec.get("tres_per_job", "").startswith("gres:gpu:1")
            rec["any_gpu"] = "gpu" in rec["tres"] or "gpu" in rec.get("tres_per_job", "")
            records[int(parts[0])] = rec
    return records


def provenance(results: Path) -> list[dict]:
    return [json.loads(p.read_text()) | {"_path": str(p)} for p in sorted(results.rglob("*.prov.json"))]


def _cancel_leftovers(workdir: Path) -> None:
    """scancel jobs of this test still queued or running (after a timeout or a failure)."""
    proc = _cmd("squeue", "-h", "-o", "%i %Z")
    ids = [
        line.split()[0]
        for line in proc.stdout.splitlines()
        if len(line.split()) == 2 and line.split()[1].startswith(str(workdir))
    ]
    if ids:
        _cmd("scancel", *ids)


@pytest.fixture(scope="module")
def cluster() -> dict:
    problem = _cluster_problem()
    if problem:
        if os.environ.get("PAPERFLOW_REQUIRE_SLURM") == "1":
            pytest.fail(f"PAPERFLOW_REQUIRE_SLURM=1 but: {problem}")
        pytest.skip(problem)
    return {"accounting": _accounting()}


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    """One tiny ph_vae run through the SLURM profile, with a GPU per training job."""
    repo = copy_repo(tmp_path_factory.mktemp("slurm") / "repo")
    cfg_path = repo / "config" / "ph_vae.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["tiny"].setdefault("resources", {})["gpus"] = 1
    # ph_vae names no dataset heavy (its paper-scale data are small); here every tiny dataset is, to exercise GPUs
    cfg["tiny"]["resources"]["gpu_datasets"] = cfg["tiny"]["run_datasets"]
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    extra = () if cluster["accounting"] else ("--slurm-status-command", "squeue")
    try:
        proc = run_snakemake(repo, *ARGS, *extra, timeout=600)
    finally:
        _cancel_leftovers(repo)
    output = proc.stdout + proc.stderr
    yield {"repo": repo, "output": output, "extra": extra, "accounting": cluster["accounting"], "cfg": cfg}
    _cancel_leftovers(repo)


def test_run_succeeds(slurm_run):
    results = slurm_run["repo"] / "results" / "tiny"
    assert (results / "ph_vae" / "report.md").is_file()
    assert (results / "summary.md").is_file()
    jobs = submitted(slurm_run["output"])
    counts = job_counts(slurm_run["output"])
    # every job but the local target rule `all` went through sbatch
    expected = {rule: n for rule, n in counts.items() if rule != "all"}
    assert Counter(rule for _, rule in jobs) == Counter(expected), slurm_run["output"][-3000:]
    assert counts.get("ph_vae_train", 0) >= 2


def test_jobs_saw_their_partition_and_gpu(slurm_run):
    """Read inside each job: training in `gpu` with CUDA_VISIBLE_DEVICES, the rest in `cpu`, no GPU."""
    records = provenance(slurm_run["repo"] / "results" / "tiny")
    assert records
    submitted_ids = {jobid for jobid, _ in submitted(slurm_run["output"])}
    rules_seen = set()
    for rec in records:
        slurm = rec.get("slurm") or {}
        where = f"{rec['_path']} (rule {rec.get('rule')}): {slurm}"
        assert slurm.get("SLURM_JOB_ID"), f"not run under SLURM: {where}"
        assert int(slurm["SLURM_JOB_ID"]) in submitted_ids, where
        rules_seen.add(rec["rule"])
        if rec["rule"] in GPU_RULES:
            assert slurm.get("SLURM_JOB_PARTITION") == "gpu", where
            assert slurm.get("CUDA_VISIBLE_DEVICES", "") != "", where
        else:
            assert slurm.get("SLURM_JOB_PARTITION") == "cpu", where
            assert not [v for v in GPU_VARS if v in slurm], where
    assert GPU_RULES <= rules_seen and len(rules_seen) > len(GPU_RULES)


def test_slurm_allocated_gpus_to_training_only(slurm_run):
    """SLURM's own records (sacct, or squeue without accounting): gres/gpu exactly on training jobs."""
    jobs = submitted(slurm_run["output"])
    records = slurm_records([jobid for jobid, _ in jobs], slurm_run["accounting"])
    assert set(records) == {jobid for jobid, _ in jobs}, records
    for jobid, rule in jobs:
        rec = records[jobid]
        where = f"SLURM job {jobid} (rule {rule}): {rec}"
        assert rec["state"].startswith("COMPLETED"), where
        if rec["comment"] not in ("", "(null)"):
            assert rec["comment"].startswith(f"rule_{rule}"), where
        if rule in GPU_RULES:
            assert rec["partition"] == "gpu" and rec["gpus"], where
        else:
            assert rec["partition"] == "cpu" and not rec["any_gpu"], where


def test_hyperparameter_change_resubmits_only_downstream(slurm_run):
    """tiny.train.lr changed: train, evaluate, report and summary are resubmitted, nothing else."""
    repo, cfg = slurm_run["repo"], slurm_run["cfg"]
    first = submitted(slurm_run["output"])
    before = Counter(rule for _, rule in first)
    raw_prov = repo / "results" / "tiny" / "ph_vae" / "raw"
    download_ids = {p.name: json.loads(p.read_text())["slurm"]["SLURM_JOB_ID"] for p in raw_prov.glob("*.prov.json")}

    lr = cfg["defaults"]["train"]["lr"]
    cfg["tiny"]["train"]["lr"] = lr * 2
    (repo / "config" / "ph_vae.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    try:
        proc = run_snakemake(repo, *ARGS, *slurm_run["extra"], timeout=600)
    finally:
        _cancel_leftovers(repo)
    output = proc.stdout + proc.stderr
    second = submitted(output)
    assert Counter(rule for _, rule in second) == Counter({r: n for r, n in before.items() if r in TRAIN_RERUN}), (
        output[-3000:]
    )
    assert not {j for j, _ in second} & {j for j, _ in first}
    # SLURM agrees: the new jobs exist and are these rules, GPUs on training only
    records = slurm_records([j for j, _ in second], slurm_run["accounting"])
    assert set(records) == {j for j, _ in second}
    for jobid, rule in second:
        assert records[jobid]["any_gpu"] == records[jobid]["gpus"] == (rule in GPU_RULES), (jobid, rule, records[jobid])
    # download and preprocess outputs were not rewritten
    assert {
        p.name: json.loads(p.read_text())["slurm"]["SLURM_JOB_ID"] for p in raw_prov.glob("*.prov.json")
    } == download_ids
    # and the new training run used the new learning rate
    train_prov = next((repo / "results" / "tiny" / "ph_vae" / "models").rglob("history.csv.prov.json"))
    rec = json.loads(train_prov.read_text())
    assert int(rec["slurm"]["SLURM_JOB_ID"]) in {j for j, r in second if r == "ph_vae_train"}
    assert rec["params"]["train"]["lr"] == pytest.approx(lr * 2)


SLURM_LOG = re.compile(r"(\S*slurm_logs/rule_ph_vae_report/\S*?\d+\.log)")


def test_failing_job_reports_its_log_keeps_outputs_and_resumes(slurm_run):
    """A job that fails on the cluster: the error and its SLURM log reach the user, finished outputs
    stay, and rerunning after the fix submits only the failed job and what depends on it."""
    repo = slurm_run["repo"]
    script = repo / "workflows" / "ph_vae" / "scripts" / "report.py"
    original = script.read_text()
    eval_outputs = sorted((repo / "results" / "tiny" / "ph_vae" / "eval").rglob("*.parquet"))
    stamps = {p: p.stat().st_mtime_ns for p in eval_outputs}
    script.write_text('raise RuntimeError("injected failure for the cluster test")\n' + original)
    try:
        proc = run_snakemake(repo, *ARGS, *slurm_run["extra"], check=False, timeout=600)
    finally:
        _cancel_leftovers(repo)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Error in rule ph_vae_report" in output, output[-3000:]
    logs = SLURM_LOG.findall(output)
    assert logs, output[-3000:]
    log = Path(logs[0]) if Path(logs[0]).is_absolute() else repo / logs[0]
    assert "injected failure for the cluster test" in log.read_text()
    assert Counter(rule for _, rule in submitted(output)) == Counter({"ph_vae_report": 1})
    assert {p: p.stat().st_mtime_ns for p in eval_outputs} == stamps  # finished outputs kept

    script.write_text(original)
    try:
        proc = run_snakemake(repo, *ARGS, *slurm_run["extra"], timeout=600)
    finally:
        _cancel_leftovers(repo)
    output = proc.stdout + proc.stderr
    assert Counter(rule for _, rule in submitted(output)) == Counter({"ph_vae_report": 1, "summary": 1}), output[-3000:]
    assert (repo / "results" / "tiny" / "ph_vae" / "report.md").is_file()
