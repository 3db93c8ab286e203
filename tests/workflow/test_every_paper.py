"""Every paper in workflows/ at tiny scale, through the real Snakemake CLI: the DAG has every stage,
the run finishes, the report states its claims, the provenance audit of the report and of the paper's
whole tree passes (and catches a flipped claim and an unrecorded file), and a second run has
nothing to do. Paper-specific content is checked in tests/papers/test_<slug>.py, and a paper's tiny outputs by
its check in tests/tiny_outputs.py, on this run's results (no second tiny run per paper)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import copy_repo, job_counts, run_snakemake
from tiny_outputs import CHECKS as TINY_CHECKS

from paperflow.core.config import available_papers, load_paper_config
from paperflow.core.provenance import audit

PAPERS = available_papers()
# CI runs every paper's smoke through Snakemake right after the tests (audit of the tree, check against the record,
# a second run with nothing to do): that covers this module's generic end-to-end checks at a larger scale. For CI's
# time it deselects (-m "not smoke_covered") the tiny runs of the papers whose tiny outputs have no check of their
# own in tests/tiny_outputs.py (the REORDER checks go with them in CI); `make test` runs them all.
TINY_PARAMS = [s if s in TINY_CHECKS else pytest.param(s, marks=pytest.mark.smoke_covered) for s in PAPERS]
STAGES = ("download", "preprocess", "train", "evaluate", "report")
CLAIM_KEYS = {
    "id",
    "statement",
    "value",
    "threshold",
    "comparison",
    "held",
    "gated",
    "seeds",
    "values",
    "value_std",
    "verdict",
    "ci_low",
    "ci_high",
    "ci_level",
    "ci_method",
    "n_units",
    "n_needed",
    "central",
    "control",
    "metric",
    "method",
    "baseline",
    "effects",
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return copy_repo(tmp_path_factory.mktemp("every") / "repo")


_DAGS: dict[tuple[Path, str], str] = {}


def dag_text(repo: Path, scale: str) -> str:
    """The output of one dry run composing every paper at `scale`, made once per worker and scale (one Snakemake
    start instead of one per paper: each costs about ten seconds of DAG building)."""
    if (repo, scale) not in _DAGS:
        _DAGS[repo, scale] = run_snakemake(repo, "-n", "--config", f"scale={scale}").stdout
    return _DAGS[repo, scale]


def dag_counts(repo: Path, scale: str) -> dict[str, int]:
    return job_counts(dag_text(repo, scale))


@pytest.mark.parametrize("slug", PAPERS)
def test_paper_scale_gpus_only_for_the_datasets_the_config_names_heavy(scratch, slug):
    """Every paper-scale job's GPU request, from the dry run: a job of a paper whose config lists `gpu_datasets`
    asks GPUs exactly when one of its wildcards is such a dataset; no CPU-class rule asks GPUs."""
    from paperflow.core.plan import parse_dry_run

    res = load_paper_config(slug, "paper")["resources"]
    jobs = [j for j in parse_dry_run(dag_text(scratch, "paper")) if j.rule.startswith(f"{slug}_")]
    assert jobs
    for job in jobs:
        if "gpu" not in job.resources or job.rule.endswith(("_download", "_preprocess", "_report")):
            assert job.gpus == 0, (job.rule, job.resources)  # CPU-class rules never ask
        elif "gpu_datasets" in res:
            heavy = bool(set(job.wildcards.values()) & set(res["gpu_datasets"]))
            assert (job.gpus > 0) == (heavy and res["gpus"] > 0), (job.rule, job.wildcards, job.resources)


# Stages a paper's DAG has no job of at a scale, and why: the training-free methods run on a pretrained model at
# paper scale. Checked both ways, so an entry cannot outlive the DAG it excuses.
ABSENT_STAGES = {
    ("specflow", "paper"): {
        "preprocess": "LLaVA's own processor prepares each image inside the evaluate job",
        "train": "SpecFlow condenses the visual tokens of pretrained LLaVA-1.5 without training",
    },
    ("doubt", "paper"): {
        "train": "DOUBT scores pretrained VLMs' sampled answers (GPU stages: sample, judge, embed, entail, and for "
        "VL-Uncertainty rephrase and sample_perturbed)",
    },
    **{
        ("enterpriseops_gym", scale): {"train": "nothing is trained: the agents run their episodes (run_agents)"}
        for scale in ("tiny", "smoke", "paper")
    },
}


@pytest.mark.parametrize("slug", PAPERS)
@pytest.mark.parametrize("scale", ["tiny", "smoke", "paper"])
def test_dag_has_every_stage(scratch, slug, scale):
    counts = dag_counts(scratch, scale)
    mine = {rule: n for rule, n in counts.items() if rule.startswith(f"{slug}_")}
    absent = ABSENT_STAGES.get((slug, scale), {})
    for stage in STAGES:
        assert (mine.get(f"{slug}_{stage}", 0) >= 1) != (stage in absent), (stage, absent.get(stage), mine)
    if slug == "enterpriseops_gym":  # its agents' stage, named for what it runs
        assert mine.get("enterpriseops_gym_run_agents", 0) >= 1, mine
    assert counts["summary"] == 1 and counts["all"] == 1
    others = {r for r in counts if r not in ("summary", "all") and not any(r.startswith(f"{p}_") for p in PAPERS)}
    assert not others, f"rules that belong to no paper: {sorted(others)}"


def test_one_paper_composes_alone(scratch):
    """`papers=[slug]` composes that paper's rules and nothing of the others'."""
    slug = "confu"
    counts = job_counts(run_snakemake(scratch, "-n", "--config", "scale=tiny", f"papers=[{slug}]").stdout)
    assert counts and all(rule in ("summary", "all") or rule.startswith(f"{slug}_") for rule in counts), counts


@pytest.mark.slow
@pytest.mark.parametrize("slug", TINY_PARAMS)
def test_tiny_run_end_to_end(scratch, slug):
    args = ("--config", "scale=tiny", f"papers=[{slug}]")
    run_snakemake(scratch, "--cores", "2", *args)
    out = scratch / "results" / "tiny" / slug
    report = out / "report.md"
    assert "| claim |" in report.read_text()
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["paper"] == slug and doc["scale"] == "tiny" and doc["claims"]
    for claim in doc["claims"]:
        assert CLAIM_KEYS <= set(claim), sorted(CLAIM_KEYS - set(claim))
        assert len(claim["values"]) == len(claim["seeds"]) >= 1, claim["id"]
    result = audit(report)
    assert result.ok, result.problems
    assert {f"{slug}_{stage}" for stage in ("train", "evaluate", "report")} <= set(result.rules.values())
    again = run_snakemake(scratch, "-n", "--cores", "2", *args)
    assert "Nothing to be done" in again.stdout + again.stderr
    assert_tree_audit_covers_the_report(out)
    if slug in TINY_CHECKS:  # the paper's own outputs, from this run (tests/tiny_outputs.py)
        TINY_CHECKS[slug](out)
    if slug in REORDER:
        assert_reordered_config_keeps_every_claim(scratch, slug, args)


def _reversed(value):
    return dict(reversed(list(value.items()))) if isinstance(value, dict) else list(reversed(value))


def _reverse_tiny(slug: str, doc: dict, *keys: str) -> None:
    """Set `keys` of the tiny block to the reverse of their resolved tiny values."""
    resolved = load_paper_config(slug, "tiny")
    for key in keys:
        assert len(resolved[key]) >= 2, (slug, key)
        doc["tiny"][key] = _reversed(resolved[key])


def _reverse_dro_flow(doc: dict) -> None:
    for name in doc["tiny"]["run_datasets"]:
        doc["tiny"]["datasets"][name]["methods"] = _reversed(doc["tiny"]["datasets"][name]["methods"])
    doc["tiny"]["run_datasets"] = _reversed(doc["tiny"]["run_datasets"])


def _reverse_credal_dro(doc: dict) -> None:
    defaults = doc["defaults"]  # methods are mappings, merged key by key: reorder them where they are defined
    for exp in defaults["experiments"]:
        defaults[exp]["methods"] = _reversed(defaults[exp]["methods"])
    defaults["experiments"] = _reversed(defaults["experiments"])


# How to list each paper's methods (and datasets, partitions, experiments) in the other order, and the
# rules whose keyed inputs then arrive in another order.
REORDER = {
    "ph_vae": (lambda doc: _reverse_tiny("ph_vae", doc, "decoders"), ("ph_vae_evaluate", "ph_vae_report")),
    "decfus": (
        lambda doc: _reverse_tiny("decfus", doc, "methods", "run_partitions"),
        ("decfus_evaluate", "decfus_report"),
    ),
    "dro_flow": (_reverse_dro_flow, ("dro_flow_evaluate", "dro_flow_report")),
    "credal_dro": (_reverse_credal_dro, ("credal_dro_evaluate", "credal_dro_report")),
}


def assert_reordered_config_keeps_every_claim(repo: Path, slug: str, args: tuple[str, ...]) -> None:
    """Keyed inputs: with the methods listed in the other order the inputs arrive in another order,
    but every claim keeps its values (no file is read under another label). The config is restored."""
    metrics = repo / "results" / "tiny" / slug / "metrics.json"
    before = {c["id"]: c for c in json.loads(metrics.read_text())["claims"]}
    path = repo / "config" / f"{slug}.yaml"
    saved = path.read_text()
    edit, rules = REORDER[slug]
    doc = yaml.safe_load(saved)
    edit(doc)
    try:
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        run_snakemake(repo, "--cores", "2", "--forcerun", *rules, *args)
        after = {c["id"]: c for c in json.loads(metrics.read_text())["claims"]}
    finally:
        path.write_text(saved)
    assert before.keys() == after.keys()
    for cid, claim in before.items():
        for key in ("values", "baseline_values", "effects", "verdict", "held"):
            assert claim[key] == after[cid][key], (slug, cid, key)


def assert_tree_audit_covers_the_report(out: Path) -> None:
    """The paper's whole tree audits clean; a flipped `held` in metrics.json fails the audit of the
    report beside it, and a file without a record fails the tree audit. Both are undone after."""
    tree = audit(out)
    assert tree.ok, tree.problems
    metrics = out / "metrics.json"
    saved, stat = metrics.read_bytes(), metrics.stat()
    doc = json.loads(saved)
    doc["claims"][0]["held"] = not doc["claims"][0]["held"]
    try:
        metrics.write_text(json.dumps(doc, indent=2))
        problems = audit(out / "report.md").problems
        assert any(p.startswith(f"MISMATCH results/tiny/{out.name}/metrics.json:") for p in problems), problems
    finally:
        metrics.write_bytes(saved)
        os.utime(metrics, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    stray = out / "unrecorded.txt"
    stray.write_text("no job wrote this")
    try:
        assert audit(out).problems == [f"NO RECORD {stray}: a file under {out} that no job recorded"]
    finally:
        stray.unlink()


def test_readme_plan_block_is_the_current_plan(scratch):
    """README's generated paper-scale plan equals `paperflow plan --scale paper` on this checkout (same dry run):
    a config or rule change that moves a job, a GPU request or a pin must regenerate it."""
    from paperflow.core.plan import PLAN_BEGIN, PLAN_END, parse_dry_run, plan_rows, render, unpinned_reasons

    rows = plan_rows(parse_dry_run(dag_text(scratch, "paper")), available_papers(scratch), "paper", scratch)
    text = (scratch / "README.md").read_text()
    block = text[text.index(PLAN_BEGIN) + len(PLAN_BEGIN) : text.index(PLAN_END)].strip()
    assert block == render(rows, "paper", unpinned_reasons(scratch)), (
        "README's plan is stale: run `paperflow plan --scale paper --readme README.md`"
    )
