"""The committed results record: docs/results/smoke.{json,md} cover every paper with a workflow, the
Markdown is the rendering of the JSON, and the README's status and times tables are derived from the records."""

from __future__ import annotations

import json
from pathlib import Path

from paperflow.core.config import available_papers
from paperflow.core.record import (
    README_BEGIN,
    README_END,
    README_TIMES_BEGIN,
    README_TIMES_END,
    TIME_SCALES,
    paper_titles,
    readme_status,
    readme_times,
    render_markdown,
)

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "results" / "smoke.json"
CPU_RECORD = ROOT / "docs" / "results" / "cpu.json"
VERDICT_KEYS = {"verdict", "ci_low", "ci_high", "ci_level", "ci_method", "n_units", "n_needed", "central", "control"}


def test_the_smoke_record_covers_every_paper():
    record = json.loads(RECORD.read_text())
    assert record["scale"] == "smoke"
    assert sorted(record["papers"]) == available_papers(ROOT)
    for slug, paper in record["papers"].items():
        assert paper["claims"], slug
        assert any(c["gated"] for c in paper["claims"]), f"{slug} has no gated claim on record"
        # a strict check needs the recording CPU (paperflow.core.record): each paper names its CPU(s)
        assert paper["cpus"] and "unknown" not in paper["cpus"], f"{slug}: re-record it with `make record`"


def test_every_claim_on_record_has_a_verdict_with_its_interval():
    for path in (RECORD, CPU_RECORD):
        record = json.loads(path.read_text())
        for slug, paper in record["papers"].items():
            for claim in paper["claims"]:
                assert VERDICT_KEYS <= set(claim), (path.name, slug, claim["id"], sorted(VERDICT_KEYS - set(claim)))
                assert claim["held"] == (claim["verdict"] == "held"), (slug, claim["id"])


def test_the_cpu_record_names_each_papers_code_hashes():
    """Every paper on the cpu record carries the hashes `paperflow record check --scale cpu` compares; a paper not yet
    on it is a warning of that check (the README's status table says "not run")."""
    record = json.loads(CPU_RECORD.read_text())
    assert record["scale"] == "cpu"
    assert set(record["papers"]) <= set(available_papers(ROOT)) and record["papers"]
    for slug, paper in record["papers"].items():
        assert set(paper["code_hashes"]) == {"paper", "core"}, slug
        assert paper["cpus"] and "unknown" not in paper["cpus"], slug
        assert paper["wall_clock_s"] is not None, slug


def test_every_paper_declares_its_claims_in_config_with_a_central_claim_and_controls():
    from paperflow.core.claims import parse_claims
    from paperflow.core.config import read_yaml

    for slug in available_papers(ROOT):
        raw = read_yaml(ROOT / "config" / f"{slug}.yaml")
        assert "cpu" in raw, f"config/{slug}.yaml has no cpu block"
        specs = parse_claims(raw.get("claims"), slug)
        assert specs, f"config/{slug}.yaml declares no claims"
        assert 1 <= sum(s.central for s in specs) <= 2, f"{slug}: one or two central claims"
        assert all(s.control is not None for s in specs if s.gated), slug


def test_the_markdown_record_is_the_rendering_of_the_json():
    for path in (RECORD, CPU_RECORD):
        record = json.loads(path.read_text())
        assert path.with_suffix(".md").read_text() == render_markdown(record)


def test_the_readme_status_table_is_derived_from_the_record():
    text = (ROOT / "README.md").read_text()
    block = text[text.index(README_BEGIN) + len(README_BEGIN) : text.index(README_END)].strip()
    records = {"smoke": json.loads(RECORD.read_text()), "cpu": json.loads(CPU_RECORD.read_text())}
    assert block == readme_status(records, available_papers(ROOT), paper_titles(ROOT)), (
        "README status table is stale: run `paperflow record readme`"
    )


def test_the_readmes_times_are_the_records():
    """Issue 56: the README states no typed time; its times table is the records' wall clocks and jobs' times."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index(README_TIMES_BEGIN) + len(README_TIMES_BEGIN) : text.index(README_TIMES_END)].strip()
    paths = {scale: ROOT / "docs" / "results" / f"{scale}.json" for scale in TIME_SCALES}
    records = {scale: json.loads(path.read_text()) for scale, path in paths.items() if path.is_file()}
    assert block == readme_times(records, available_papers(ROOT)), (
        "README times table is stale: run `paperflow record readme`"
    )
