"""A real tiny run of the whole DAG through the Snakemake CLI, then reruns, audit and the HTML report.

One run is shared by the module (about a minute on 2 cores); the checks after it edit the scratch
copy and use dry runs, so they cost seconds each.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import copy_repo, job_counts, run_snakemake

from paperflow.core.provenance import audit, read_record

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("tiny_run")]  # one worker builds the tiny_run fixture
TINY = ("--config", "scale=tiny", "papers=[ph_vae]")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    repo = copy_repo(tmp_path_factory.mktemp("tiny") / "repo")
    run_snakemake(repo, "--cores", "2", *TINY)
    return repo


def dry_counts(repo: Path) -> dict[str, int]:
    return job_counts(run_snakemake(repo, "-n", "--cores", "2", *TINY).stdout)


def test_outputs_report_and_summary(tiny_run):
    out = tiny_run / "results" / "tiny"
    report = (out / "ph_vae" / "report.md").read_text()
    assert "| claim |" in report and "ks_tail_ph_lt_gauss_pareto1d" in report
    doc = json.loads((out / "ph_vae" / "metrics.json").read_text())
    assert not [c for c in doc["claims"] if c["gated"]]  # tiny gates nothing: its claims are reported
    central = {c["id"] for c in doc["claims"] if c["central"]}
    assert central == {"ks_tail_ph_lt_gauss_pareto1d", "q99_rel_ph_lt_gauss_pareto1d"}
    assert all(c["held"] == (c["verdict"] == "held") for c in doc["claims"])
    assert (out / "ph_vae" / "metrics.parquet").is_file()
    assert "ph_vae" in (out / "summary.md").read_text()
    for fig in ("tail_survival", "qq", "training_loss"):
        assert (out / "ph_vae" / "figures" / f"{fig}.png").read_bytes()[:4] == b"\x89PNG"
    ckpt = read_record(out / "ph_vae" / "models" / "pareto1d" / "ph" / "seed0.ckpt")
    assert ckpt["rule"] == "ph_vae_train" and ckpt["seeds"] == [0, 1]
    assert ckpt["params"]["train"]["epochs"] == 2 and ckpt["code"]["modules"]
    assert "paperflow/ph_vae/training.py" in ckpt["code"]["modules"]
    assert ckpt["environment"]["conda_env"]["path"] == "envs/torch.yaml"


def test_nothing_to_do_after_a_complete_run(tiny_run):
    assert dry_counts(tiny_run) == {}


def test_audit_passes_then_names_a_tampered_intermediate(tiny_run):
    report = tiny_run / "results" / "tiny" / "ph_vae" / "report.md"
    result = audit(report)
    assert result.ok, result.problems
    assert {"ph_vae_download", "ph_vae_preprocess", "ph_vae_train", "ph_vae_evaluate", "ph_vae_report"} <= set(
        result.rules.values()
    )
    victim = tiny_run / "results" / "tiny" / "ph_vae" / "data" / "pareto1d" / "train.parquet"
    saved = victim.read_bytes()
    try:
        victim.write_bytes(saved + b"\0")
        proc = run_cli(tiny_run, "audit", str(report.relative_to(tiny_run)))
        assert proc.returncode == 1
        assert "results/tiny/ph_vae/data/pareto1d/train.parquet" in proc.stderr and "MISMATCH" in proc.stderr
    finally:
        victim.write_bytes(saved)
    assert run_cli(tiny_run, "audit", str(report.relative_to(tiny_run))).returncode == 0


def run_cli(repo: Path, *args: str):
    import subprocess
    import sys

    return subprocess.run(
        [str(Path(sys.executable).with_name("paperflow")), *args], cwd=repo, capture_output=True, text=True
    )


def test_training_hyperparameter_reruns_train_evaluate_report_only(tiny_run, tmp_path):
    repo = copy_state(tiny_run, tmp_path)
    cfg_path = repo / "config" / "ph_vae.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["tiny"]["train"]["lr"] = 0.005
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    counts = dry_counts(repo)
    assert set(counts) == {"ph_vae_train", "ph_vae_evaluate", "ph_vae_report", "summary", "all"}, counts
    assert counts["ph_vae_train"] == 4 and counts["ph_vae_evaluate"] == 2  # 2 datasets x 2 decoders


@pytest.mark.parametrize(
    "module, expected",
    [
        ("paperflow/ph_vae/metrics.py", {"ph_vae_evaluate", "ph_vae_report", "summary", "all"}),
        ("paperflow/ph_vae/training.py", {"ph_vae_train", "ph_vae_evaluate", "ph_vae_report", "summary", "all"}),
        ("paperflow/ph_vae/claims.py", {"ph_vae_report", "summary", "all"}),
        (
            "paperflow/ph_vae/prepare.py",
            {
                "ph_vae_download",
                "ph_vae_preprocess",
                "ph_vae_train",
                "ph_vae_evaluate",
                "ph_vae_report",
                "summary",
                "all",
            },
        ),
    ],
)
def test_library_edit_reruns_its_stage_and_descendants(tiny_run, tmp_path, module, expected):
    repo = copy_state(tiny_run, tmp_path)
    path = repo / "modules" / module
    path.write_text(path.read_text() + "\n# edited\n")
    assert set(dry_counts(repo)) == expected


def copy_state(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of the finished run (sources, results and Snakemake's metadata) to edit freely."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_run, repo, symlinks=True, ignore=shutil.ignore_patterns("locks", "incomplete"))
    return repo


def test_snakemake_html_report_holds_the_figures_and_table(tiny_run):
    target = tiny_run / "report.zip"
    run_snakemake(tiny_run, "--report", str(target), *TINY)
    names = zipfile.ZipFile(target).namelist()
    for item in ("tail_survival.png", "qq.png", "training_loss.png", "tail_metrics.csv", "summary.md"):
        assert any(n.endswith(item) for n in names), (item, names[:20])


def test_a_narrowed_run_summarises_every_paper_with_results_and_leaves_a_plain_run_nothing(tiny_run, tmp_path):
    """A run of two papers, then runs narrowed to one of them: the narrowed run plans nothing while the results are
    current, and after a change to its paper it rewrites the summary of both (the scale's summary, not one of its
    own papers alone), so that the plain run after it plans no job (no "set of input files has changed")."""
    repo = copy_state(tiny_run, tmp_path)
    both = ("--config", "scale=tiny", "papers=[ph_vae,decfus]")
    run_snakemake(repo, "--cores", "2", *both)
    assert dry_counts(repo) == {}
    claims = repo / "modules" / "paperflow" / "ph_vae" / "claims.py"
    claims.write_text(claims.read_text() + "\n# edited\n")
    assert set(dry_counts(repo)) == {"ph_vae_report", "summary", "all"}
    run_snakemake(repo, "--cores", "2", *TINY)
    assert "of 2 paper(s)" in (repo / "results" / "tiny" / "summary.md").read_text()
    assert job_counts(run_snakemake(repo, "-n", "--cores", "2", *both).stdout) == {}
