"""The committed results record: docs/results/smoke.{json,md} cover every paper with a workflow, the
Markdown is the rendering of the JSON, and the README's status table is derived from the record."""

from __future__ import annotations

import json
from pathlib import Path

from paperflow.core.config import available_papers
from paperflow.core.record import README_BEGIN, README_END, paper_titles, readme_status, render_markdown

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "results" / "smoke.json"


def test_the_smoke_record_covers_every_paper():
    record = json.loads(RECORD.read_text())
    assert record["scale"] == "smoke"
    assert sorted(record["papers"]) == available_papers(ROOT)
    for slug, paper in record["papers"].items():
        assert paper["claims"], slug
        assert any(c["gated"] for c in paper["claims"]), f"{slug} has no gated claim on record"
        # a strict check needs the recording CPU (paperflow.core.record): each paper names its CPU(s)
        assert paper["cpus"] and "unknown" not in paper["cpus"], f"{slug}: re-record it with `make record`"


def test_the_markdown_record_is_the_rendering_of_the_json():
    record = json.loads(RECORD.read_text())
    assert (ROOT / "docs" / "results" / "smoke.md").read_text() == render_markdown(record)


def test_the_readme_status_table_is_derived_from_the_record():
    text = (ROOT / "README.md").read_text()
    block = text[text.index(README_BEGIN) + len(README_BEGIN) : text.index(README_END)].strip()
    records = {"smoke": json.loads(RECORD.read_text())}
    assert block == readme_status(records, available_papers(ROOT), paper_titles(ROOT)), (
        "README status table is stale: run `paperflow record readme`"
    )
