"""`paperflow record restamp`: a record crosses a change only where the paper's jobs at that scale are planned as at
the commit the record vouches for, code hashes included (the real repository's committed cpu record; the plan of a
cheap paper, or a plan with one job moved)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from paperflow.core.cli import main as cli_main
from paperflow.core.jobtable import plan_of
from paperflow.core.record import RecordError, restamp_record

ROOT = Path(__file__).resolve().parents[2]
PAPER = "annealed_langevin"  # its cpu plan is two dozen jobs, read in about a second


@pytest.fixture
def record(tmp_path):
    out = tmp_path / "record"
    shutil.copytree(ROOT / "docs" / "results", out)
    return out


def test_an_unmoved_plan_is_restamped_and_the_entry_says_so(record, capsys):
    assert (
        cli_main(["record", "restamp", "--scale", "cpu", "--papers", PAPER, "--since", "HEAD", "--record", str(record)])
        == 0
    )
    assert f"restamped {PAPER}: 24 cpu jobs planned as at" in capsys.readouterr().out
    entry = json.loads((record / "cpu.json").read_text())["papers"][PAPER]
    assert entry["restamped"][-1]["jobs"] == 24
    assert "Restamped from" in (record / "cpu.md").read_text()


def test_a_moved_job_refuses_naming_it(record):
    def moved(root, scale, papers):
        jobs = plan_of(root, scale, papers)
        if Path(root).resolve() == ROOT:  # today's checkout: one job asks for more memory
            mine = next(j for j in jobs if j["rule"].startswith(PAPER))
            mine["resources"] = {**mine["resources"], "mem_mb": 1}
        return jobs

    with pytest.raises(RecordError, match=rf"{PAPER}: its cpu plan moved since .*resources was .*rerun it"):
        restamp_record(record, "cpu", [PAPER], "HEAD", root=ROOT, plan=moved)


def test_a_record_that_did_not_vouch_for_the_commit_refuses(record):
    doc = json.loads((record / "cpu.json").read_text())
    doc["papers"][PAPER]["code_hashes"]["paper"] = "0" * 64
    (record / "cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    from paperflow.core.record import render_markdown

    (record / "cpu.md").write_text(render_markdown(doc))
    with pytest.raises(RecordError, match=rf"{PAPER}: the record's paper hash 000000000000 is not that of HEAD"):
        restamp_record(record, "cpu", [PAPER], "HEAD", root=ROOT)
