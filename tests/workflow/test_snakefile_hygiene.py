"""Static rules of every paper's Snakefile, read as text: composition by `include:` shares one
namespace, so a paper's module-level names carry its slug, wildcard constraints are per rule (a
global block applies to every rule defined so far, other papers' included), GPUs are asked for only
through `heavy_resources`, and every train and evaluate rule writes a benchmark file."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from paperflow.core.config import SCALES, available_papers

ROOT = Path(__file__).resolve().parents[2]
PAPERS = available_papers(ROOT)
TOP_LEVEL_NAME = re.compile(r"^(?:def\s+(\w+)|class\s+(\w+)|(\w+)\s*(?::[^=]+)?=[^=])")
RULE = re.compile(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", re.M)


def snakefile(slug: str) -> str:
    """The paper's rules: its Snakefile and the .smk files beside it (a paper may keep the rules of one scale apart,
    as lozo_plus does with synthetic.smk and paper.smk)."""
    return "\n".join(path.read_text() for path in workflow_files(slug))


def workflow_files(slug: str) -> list[Path]:
    """The paper's Snakefile and the .smk files beside it (its functions, kept apart for --lint)."""
    folder = ROOT / "workflows" / slug
    return [folder / "Snakefile", *sorted(folder.glob("*.smk"))]


def module_level_names(text: str) -> list[str]:
    names = []
    for line in text.splitlines():
        match = TOP_LEVEL_NAME.match(line)
        if match:
            names.append(next(g for g in match.groups() if g))
    return names


def test_the_name_pattern_sees_assignments_and_functions():
    text = "A = 1\ndef b(x):\n    y = 2\nrule c:\n    input:\n        d=1\nE: dict = {}\nif A == 1:\n    pass\n"
    assert module_level_names(text) == ["A", "b", "E"]


@pytest.mark.parametrize("slug", PAPERS)
def test_module_level_names_carry_the_slug(slug):
    for path in workflow_files(slug):
        names = module_level_names(path.read_text())
        stray = [n for n in names if n.lower() != slug and not n.lower().startswith(slug + "_")]
        assert not stray, f"{path.relative_to(ROOT)} defines {stray}: prefix them with {slug}_ or {slug.upper()}_"


@pytest.mark.parametrize("slug", PAPERS)
def test_wildcard_constraints_are_per_rule(slug):
    assert not re.search(r"^wildcard_constraints:", snakefile(slug), re.M), (
        f"workflows/{slug}/Snakefile has a global wildcard_constraints block; put them in each rule"
    )


@pytest.mark.parametrize("slug", PAPERS)
def test_gpus_only_through_heavy_resources(slug):
    text = snakefile(slug)
    assert not re.search(r"\bgpu\s*=|[\"']gpu[\"']\s*:", text), (
        f"workflows/{slug}/Snakefile sets gpu itself; use heavy_resources (its `gpus` for a count per wildcard)"
    )
    calls = re.findall(r"heavy_resources\(\s*([^,)]*)", text)
    wrong = [c for c in calls if not re.fullmatch(r'"(train|infer|train_node)_gpu"', c.strip())]
    assert not wrong, f"workflows/{slug}: heavy_resources with a class that is not a GPU class: {wrong}"


def planned_jobs() -> list[dict]:
    """Every scale's planned jobs, from the snapshots test_plan_equal holds the workflows to."""
    jobs = []
    for scale in SCALES:
        with gzip.open(ROOT / "tests" / "data" / "plans" / f"{scale}.json.gz", "rt") as fh:
            jobs += json.load(fh)
    return jobs


@pytest.mark.parametrize("slug", PAPERS)
def test_train_and_evaluate_rules_write_benchmarks(slug):
    heavy = [j for j in planned_jobs() if re.fullmatch(rf"{slug}_(\w+_)?(train|evaluate)(_\w+)?", j["rule"])]
    assert heavy, f"workflows/{slug} plans no train or evaluate job"
    missing = sorted({j["rule"] for j in heavy if not j["benchmark"]})
    assert not missing, f"rules without benchmark: {missing}"
