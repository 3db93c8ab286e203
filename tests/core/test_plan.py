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
    out = subprocess.run(
        [sys.executable, "-m", "paperflow.core.cli", "plan", "safer", "--scale", "paper"],
        cwd=dry_repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| safer |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    counts = job_counts(run_snakemake(dry_repo, "-n", "--config", "scale=paper", "papers=[safer]").stdout)
    assert int(cells[1]) == sum(n for rule, n in counts.items() if rule.startswith("safer_"))
    assert int(cells[3]) == counts["safer_pretrain"] + counts["safer_train"] + counts["safer_evaluate"]  # GPU jobs
    gpus = [
        j.gpus
        for j in parse_dry_run(run_snakemake(dry_repo, "-n", "--config", "scale=paper", "papers=[safer]").stdout)
        if j.rule.startswith("safer_") and j.gpus
    ]
    assert cells[4] == ", ".join(f"{n}: {gpus.count(n)}" for n in sorted(set(gpus)))  # GPUs per job: jobs
    assert int(cells[8]) == 4 and "datasets.arxiv.sha256" in cells[9]  # the four OGB / DGL archives
    readme = tmp_path / "R.md"
    readme.write_text(f"intro\n{PLAN_BEGIN}\nold\n{PLAN_END}\nrest\n")
    again = subprocess.run(
        [sys.executable, "-m", "paperflow.core.cli", "plan", "safer", "--readme", str(readme)],
        cwd=dry_repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    text = readme.read_text()
    assert row in text and "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    bad = subprocess.run(
        [sys.executable, "-m", "paperflow.core.cli", "plan", "nosuch"],
        cwd=dry_repo,
        env=env,
        capture_output=True,
        text=True,
    )
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


def test_every_unpinned_paper_download_has_a_reason_and_no_reason_outlives_its_key():
    from pathlib import Path

    from paperflow.core.config import available_papers, load_paper_config
    from paperflow.core.download import read_lock, read_lock_revisions
    from paperflow.core.plan import unpinned_reasons

    root = Path(__file__).resolve().parents[2]
    reasons = unpinned_reasons(root)
    assert set(reasons) <= set(available_papers(root)), "config/unpinned.yaml names an unknown paper"
    for slug in available_papers(root):
        cfg = load_paper_config(slug, "paper", root)
        unpinned = set(unpinned_downloads(cfg, read_lock(slug, root), revisions=read_lock_revisions(slug, root)))
        mine = reasons.get(slug, {})
        assert unpinned <= set(mine), f"{slug}: no reason in config/unpinned.yaml for {sorted(unpinned - set(mine))}"
        assert set(mine) <= unpinned, (
            f"{slug}: config/unpinned.yaml keeps reasons for pinned {sorted(set(mine) - unpinned)}"
        )
        assert all(len(why) > 20 for why in mine.values())


def test_render_lists_each_unpinned_key_with_its_reason():
    from paperflow.core.plan import render

    rows = [
        {
            "paper": "p",
            "jobs": 1,
            "GPU jobs": 0,
            "GPU-hours": 0.0,
            "CPU-hours": 1.0,
            "unpinned downloads": 2,
            "unpinned keys": "a.sha256, b.sha256",
        },
        {
            "paper": "q",
            "jobs": 1,
            "GPU jobs": 0,
            "GPU-hours": 0.0,
            "CPU-hours": 1.0,
            "unpinned downloads": 0,
            "unpinned keys": "-",
        },
    ]
    text = render(rows, "paper", {"p": {"a.sha256": "the host publishes none"}})
    assert "- `p` `a.sha256`: the host publishes none" in text
    assert "- `p` `b.sha256`: no reason recorded" in text and "`q`" not in text.split("why no published")[1]
    assert "why no published" not in render(rows[1:], "paper", {})


def test_readme_rows_read_back_what_render_wrote_and_a_subset_replaces_only_its_rows(tmp_path):
    from paperflow.core.plan import merge_rows, readme_rows, render, write_readme_block

    rows = [
        {
            "paper": "p",
            "jobs": 3,
            "jobs per rule": "train 2, report 1",
            "GPU jobs": 2,
            "GPUs per job: jobs": "1: 1, 4: 1",
            "GPU-hours": 16.0,
            "CPU-hours": 0.5,
            "max memory (GB)": 64.0,
            "unpinned downloads": 1,
            "unpinned keys": "a.sha256",
        },
        {
            "paper": "q",
            "jobs": 1,
            "jobs per rule": "report 1",
            "GPU jobs": 0,
            "GPUs per job: jobs": "-",
            "GPU-hours": 0,
            "CPU-hours": 0.2,
            "max memory (GB)": 2.0,
            "unpinned downloads": 0,
            "unpinned keys": "-",
        },
    ]
    readme = tmp_path / "R.md"
    readme.write_text(f"x\n{PLAN_BEGIN}\n{PLAN_END}\n")
    write_readme_block(readme, render(rows, "paper", {"p": {"a.sha256": "none published anywhere we looked"}}))
    assert readme_rows(readme) == rows
    q2 = dict(rows[1], jobs=5, **{"jobs per rule": "train 4, report 1"})
    merged = merge_rows(readme_rows(readme), [q2], ["q", "p", "r"])
    assert merged == [q2, rows[0]]


def test_plan_rows_count_jobs_by_the_gpus_each_asks_for():
    from pathlib import Path

    from paperflow.core.plan import PlannedJob, plan_rows

    root = Path(__file__).resolve().parents[2]
    jobs = [
        PlannedJob("safer_train", 8, {"gpu": "4", "runtime": "60"}),
        PlannedJob("safer_train", 8, {"gpu": "4", "runtime": "60"}),
        PlannedJob("safer_evaluate", 2, {"gpu": "1", "runtime": "30"}),
        PlannedJob("safer_report", 1, {"runtime": "30"}),
        PlannedJob("ph_vae_train", 1, {"gpu": "2", "runtime": "60"}),  # another paper's job is not counted
    ]
    (row,) = plan_rows(jobs, ["safer"], "paper", root)
    assert row["GPU jobs"] == 3 and row["GPUs per job: jobs"] == "1: 1, 4: 2"
    assert row["GPU-hours"] == 8.5 and row["CPU-hours"] == 0.5
    (none,) = plan_rows(jobs[3:4], ["safer"], "paper", root)
    assert none["GPUs per job: jobs"] == "-"
