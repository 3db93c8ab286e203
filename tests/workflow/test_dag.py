"""The composed DAG: builds at every scale, narrows to one paper, lints, and every rule is complete."""

from __future__ import annotations

import ast
import gzip
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from conftest import job_counts, run_snakemake

from paperflow.core.config import SCALES, available_papers, load_paper_config

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("download", "preprocess", "train", "evaluate", "report")


def test_dry_run_of_every_paper_is_fast(dry_repo):
    """The whole composed DAG (papers: all) at smoke scale: the per-paper stages are in
    tests/workflow/test_every_paper.py."""
    t0 = time.perf_counter()
    proc = run_snakemake(dry_repo, "-n", "--config", "scale=smoke")
    elapsed = time.perf_counter() - t0
    counts = job_counts(proc.stdout)
    for slug in available_papers(dry_repo):
        assert counts.get(f"{slug}_report") == 1, (slug, counts)
    assert counts["summary"] == 1 and counts["all"] == 1
    assert elapsed < 60, f"dry run took {elapsed:.1f} s"


# the libraries a job needs and the DAG must not: any of them in the Snakemake process costs every command seconds
HEAVY = ("torch", "transformers", "lightning", "pytorch_lightning", "matplotlib", "scipy", "sklearn")
# runs Snakemake's CLI in this process, then names the heavy libraries the DAG build left in sys.modules
DAG_IMPORTS = """
import json, sys
from snakemake.cli import main
out, heavy, args = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
try:
    main(args)
except SystemExit as stop:
    code = stop.code
open(out, "w").write(json.dumps({"exit": code, "heavy": [m for m in heavy if m in sys.modules]}))
"""


@pytest.mark.parametrize("scale", ["tiny", "smoke", "cpu", "paper"])
def test_building_the_dag_imports_no_heavy_library(dry_repo, tmp_path, scale):
    """`snakemake -n` of every paper loads the configs and runs their checks, the input functions and the code
    hashes, and none of it imports torch, transformers or another heavy library (issue 56: they cost every
    Snakemake command, and every job a cluster starts, seconds)."""
    out = tmp_path / "imports.json"
    env = dict(os.environ, WANDB_MODE="disabled")
    env.pop("PYTHONPATH", None)
    args = [str(out), ",".join(HEAVY), "-n", "--quiet", "--config", f"scale={scale}"]
    proc = subprocess.run(
        [sys.executable, "-c", DAG_IMPORTS, *args], cwd=dry_repo, capture_output=True, text=True, env=env, timeout=600
    )
    assert out.is_file(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["exit"] == 0, proc.stderr[-4000:]
    assert result["heavy"] == [], f"building the {scale} DAG imported {result['heavy']}"


def test_config_narrows_to_one_paper_and_target_file_runs_one_report(dry_repo):
    proc = run_snakemake(dry_repo, "-n", "--config", "scale=tiny", "papers=[ph_vae]")
    assert "ph_vae_report" in job_counts(proc.stdout)
    proc = run_snakemake(dry_repo, "-n", "--config", "scale=tiny", "--", "results/tiny/ph_vae/tables/tail_metrics.csv")
    counts = job_counts(proc.stdout)
    assert "summary" not in counts and "all" not in counts and counts.get("ph_vae_report") == 1


GPU_FREE_STAGES = ("download", "preprocess", "report")


def test_gpus_only_at_paper_scale_and_only_for_heavy_rules(dry_repo):
    """No rule asks for a GPU at tiny/smoke scale; at paper scale every paper has at least one GPU
    rule (its heavy training or evaluation), and download, preprocess, report and summary never do."""
    papers = available_papers(dry_repo)
    for scale in ("smoke", "paper"):
        proc = run_snakemake(dry_repo, "-n", "--config", f"scale={scale}", "--printshellcmds")
        gpu_rules = set()
        for block in proc.stdout.split("\nrule ")[1:]:
            rule = block.split(":", 1)[0]
            gpu_line = [l for l in block.splitlines() if l.strip().startswith("resources:")]
            gpus = int(gpu_line[0].split("gpu=")[1].split(",")[0]) if gpu_line and "gpu=" in gpu_line[0] else 0
            if gpus:
                gpu_rules.add(rule)
                assert scale == "paper", (scale, rule, gpu_line)
                assert rule != "summary" and not rule.endswith(GPU_FREE_STAGES), (rule, gpu_line)
        if scale == "paper":
            for slug in papers:
                # a paper whose config names no dataset heavy (gpu_datasets: []) runs on CPUs only
                if load_paper_config(slug, "paper", dry_repo)["resources"].get("gpu_datasets") == []:
                    assert not any(r.startswith(f"{slug}_") for r in gpu_rules), slug
                    continue
                assert any(r.startswith(f"{slug}_") for r in gpu_rules), (
                    f"{slug}: no rule asks for a GPU at paper scale"
                )
    assert "st_gfn_train" in gpu_rules and "ph_vae_train" not in gpu_rules


def test_lint_is_clean(dry_repo):
    proc = run_snakemake(dry_repo, "--lint", "--config", "scale=tiny", check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def rules_with_scripts() -> list[tuple[str, str, str]]:
    """(rule, conda env stack, script path) of every rule that runs a script, from every scale's planned jobs (the
    snapshots test_plan_equal holds the workflows to): stage rules and hand-written ones alike. A job's code param
    must name the env it runs in."""
    found = set()
    for scale in SCALES:
        with gzip.open(ROOT / "tests" / "data" / "plans" / f"{scale}.json.gz", "rt") as fh:
            jobs = json.load(fh)
        for job in jobs:
            if job["script"] is None:
                continue
            assert job["conda"], f"rule {job['rule']} runs a script without a conda env"
            assert job["params"]["code"]["env"] == job["conda"], (job["rule"], job["params"]["code"], job["conda"])
            found.add((job["rule"], Path(job["conda"]).stem, job["script"]))
    return sorted(found)


def env_distributions(stack: str) -> set[str]:
    spec = yaml.safe_load((ROOT / "envs" / f"{stack}.yaml").read_text())
    names = set()
    for dep in spec["dependencies"]:
        for item in dep["pip"] if isinstance(dep, dict) else [dep]:
            names.add(item.replace("==", "=").split("=")[0].strip().lower())
    return names


def third_party_imports(script: Path) -> set[str]:
    """Top-level third-party modules imported by the script and the paperflow modules it uses."""
    from paperflow.core.codehash import module_closure

    files = [script] + [path for _, path in module_closure(script)]
    mods = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                mods.add(node.module.split(".")[0])
    return {m for m in mods if m not in sys.stdlib_module_names and m != "paperflow"}


CONDA_NAMES = {"matplotlib": "matplotlib-base"}  # conda-forge's split packages
# imports whose distribution has another name and is only in a rule's env, not in the local venv
ENV_ONLY = {"open_clip": ["open-clip-torch"]}


def test_every_rule_has_an_env_that_covers_its_imports():
    rules = rules_with_scripts()
    # every paper's stages at every scale (st_gfn's from its stage table, lozo_plus's and itpo's paper-scale training)
    assert {r for r, _, _ in rules} >= {f"ph_vae_{s}" for s in STAGES} | {
        "summary",
        "st_gfn_train",
        "lozo_plus_train",
        "itpo_train",
    }
    dist_of = metadata.packages_distributions()
    for rule, stack, script in rules:
        assert (ROOT / "envs" / f"{stack}.yaml").is_file(), (rule, stack)
        have = env_distributions(stack)
        for module in third_party_imports(ROOT / script):
            dists = {d.lower() for d in dist_of.get(module, ENV_ONLY.get(module, [module]))}
            dists |= {CONDA_NAMES.get(d, d) for d in dists}
            assert dists & have, (
                f"rule {rule}: env {stack} lacks a package for `import {module}` (one of {sorted(dists)})"
            )


def test_env_files_are_pinned():
    for env in ROOT.glob("envs/*.yaml"):
        spec = yaml.safe_load(env.read_text())
        assert "nodefaults" in spec["channels"], env
        for dep in spec["dependencies"]:
            for item in dep["pip"] if isinstance(dep, dict) else [dep]:
                assert "=" in item, f"{env.name}: {item} is not pinned"


def test_multi_device_training_requests_matching_gpus_and_cpus(repo_copy):
    """train.devices = 2 with 2 GPUs at paper scale: the train job asks for gpu=2; on CPU (tiny) for 2 threads."""
    cfg_path = repo_copy / "config" / "ph_vae.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["paper"]["train"]["devices"] = 2
    cfg["paper"]["resources"]["gpus"] = 2
    cfg["paper"]["resources"]["gpu_datasets"] = cfg["paper"]["run_datasets"]  # every dataset heavy, for this test
    cfg["tiny"]["train"]["devices"] = 2
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for scale, gpus in (("paper", 2), ("tiny", 0)):
        out = run_snakemake(repo_copy, "-n", "--cores", "4", "--config", f"scale={scale}").stdout
        train = [b for b in out.split("\nrule ")[1:] if b.startswith("ph_vae_train:")]
        assert train
        for block in train:
            assert "threads: 2" in block, block
            res = next(l for l in block.splitlines() if l.strip().startswith("resources:"))
            assert f"gpu={gpus}" in res, res


def test_node_gpu_class_asks_one_node_and_launches_one_process_per_gpu(repo_copy):
    """The multi-GPU class (train_node_gpu): a dry run shows gpu=N on one node as one task, the CPUs the rule
    asks for, and the torchrun command that starts N processes inside the job; one GPU starts plain python."""
    (repo_copy / "probe.smk").write_text(
        'configfile: "config/config.yaml"\n\n\ninclude: "rules/common.smk"\n\n\n'
        "rule all:\n    input:\n        expand('results/probe_{n}.txt', n=[1, 4]),\n\n\n"
        "rule probe_train:\n    output:\n        'results/probe_{n}.txt',\n    threads: 16\n"
        "    resources:\n        **resources_of('train_node_gpu', gpu=4),\n"
        "    params:\n        launch=lambda wc: torchrun_prefix(int(wc.n)),\n"
        "    shell:\n        '{params.launch} -m paperflow.probe > {output}'\n"
    )
    out = run_snakemake(repo_copy, "-s", "probe.smk", "-n", "-p", "--cores", "16").stdout
    blocks = [b for b in out.split("\nrule ")[1:] if b.startswith("probe_train:")]
    assert len(blocks) == 2
    for block in blocks:
        assert "threads: 16" in block, block
        res = next(l for l in block.splitlines() if l.strip().startswith("resources:"))
        assert all(f in res for f in ("gpu=4", "nodes=1", "tasks=1", "mem_mb=256000")), res
    assert "python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=4 -m paperflow.probe" in out
    assert "python -m paperflow.probe > results/probe_1.txt" in out, out[-3000:]
