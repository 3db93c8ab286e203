"""`paperflow plan`: the jobs and resources of a dry run, parsed; downloads without a checksum found in a config
and cleared by a lock entry; the table from the real CLI on a paper at paper scale, and its README block."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import job_counts, run_snakemake

from paperflow.core.plan import PLAN_BEGIN, PLAN_END, parse_dry_run, unpinned_downloads

DRY = """Job stats:
rule x_train:
    output: a
    threads: 4
    resources: tmpdir=/tmp, runtime=480, gpu=2, mem_mb=64000, mem=64 GB
rule x_report:
    output: b
    resources: tmpdir=/tmp, runtime=15, mem_mb=2000
"""


def test_parse_dry_run_reads_rules_threads_and_resources():
    a, b = parse_dry_run(DRY)
    assert (a.rule, a.threads, a.gpus, a.hours, a.mem_gb) == ("x_train", 4, 2, 8.0, 64.0)
    assert (b.rule, b.threads, b.gpus, b.hours) == ("x_report", 1, 0, 0.25)


def test_unpinned_downloads_in_a_config_and_the_lock_clears_them():
    cfg = {
        "datasets": {
            "a": {"url": "http://h/a.zip", "sha256": None},
            "b": {"url": "http://h/b.zip", "sha256": "f" * 64},
            "c": {"url": None, "sha256": None},  # generated, nothing to download
            "d": {"train_url": "http://h/d1", "train_sha256": None, "test_url": "http://h/d2", "test_sha256": "0" * 64},
        },
        "envs": {"e": {"base_url": "http://g/", "sha256": {"m": None, "n": "1" * 64}}},
    }
    assert unpinned_downloads(cfg, {}) == ["datasets.a.sha256", "datasets.d.train_sha256", "envs.e.sha256.m"]
    lock = {"http://h/a.zip": {"sha256": "2" * 64}, "http://g/m.gz": {"sha256": "3" * 64}}
    assert unpinned_downloads(cfg, lock) == ["datasets.d.train_sha256"]


def test_plan_cli_on_a_paper_counts_the_dry_runs_jobs_and_writes_the_readme_block(dry_repo, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(dry_repo / "modules")}
    out = subprocess.run([sys.executable, "-m", "paperflow.core.cli", "plan", "safer", "--scale", "paper"],
                         cwd=dry_repo, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| safer |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    counts = job_counts(run_snakemake(dry_repo, "-n", "--config", "scale=paper", "papers=[safer]").stdout)
    assert int(cells[1]) == sum(n for rule, n in counts.items() if rule.startswith("safer_"))
    assert int(cells[3]) == counts["safer_pretrain"] + counts["safer_train"] + counts["safer_evaluate"]  # GPU jobs
    assert int(cells[7]) == 4 and "datasets.arxiv.sha256" in cells[8]  # the four OGB / DGL archives
    readme = tmp_path / "R.md"
    readme.write_text(f"intro\n{PLAN_BEGIN}\nold\n{PLAN_END}\nrest\n")
    again = subprocess.run([sys.executable, "-m", "paperflow.core.cli", "plan", "safer", "--readme", str(readme)],
                           cwd=dry_repo, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    text = readme.read_text()
    assert row in text and "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    bad = subprocess.run([sys.executable, "-m", "paperflow.core.cli", "plan", "nosuch"], cwd=dry_repo, env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "unknown paper(s) ['nosuch']" in bad.stderr


def test_profiles_install_links_them_where_snakemake_finds_a_bare_name(dry_repo, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(dry_repo / "modules"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    cmd = [sys.executable, "-m", "paperflow.core.cli", "profiles", "install"]
    first = subprocess.run(cmd, cwd=dry_repo, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    link = tmp_path / "xdg" / "snakemake" / "slurm"
    assert link.is_symlink() and link.resolve() == (dry_repo / "profiles" / "slurm").resolve()
    again = subprocess.run(cmd, cwd=dry_repo, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "(already)" in again.stdout
    other = tmp_path / "xdg" / "snakemake" / "local"
    other.unlink()
    other.mkdir()
    refused = subprocess.run(cmd, cwd=dry_repo, env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "--force replaces it" in refused.stderr
    assert subprocess.run([*cmd, "--force"], cwd=dry_repo, env=env, capture_output=True).returncode == 0
    snakemake = [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "local",
        "-n",
        "--config",
        "scale=tiny",
        "papers=[uka]",
    ]
    dry = subprocess.run(snakemake, cwd=dry_repo, env={**env, "PYTHONPATH": ""}, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "uka_report" in dry.stdout
