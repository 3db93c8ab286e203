"""Results on record: write from an audited synthetic tree, then check a fresh tree against it (pass,
a moved value, a flip far from and within the tolerance of the threshold, claims that come and go)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from paperflow.core import claims as claims_lib
from paperflow.core.cli import main as cli_main
from paperflow.core.provenance import build_record, cpu_label, cpu_state, utc_now, write_record
from paperflow.core.record import (
    DEFAULT_RTOL,
    Tolerance,
    compare_records,
    readme_status,
    readme_times,
    refresh_readme,
    render_markdown,
)
from paperflow.core.report import fmt, write_metrics

SCALE = "smoke"
THRESHOLD = 0.5
BASE = {"ph_x": [0.1, 0.2, 0.15], "ph_y": [0.3, 0.35, 0.25]}  # per-seed values of each paper's claim


def compare_claim(*, id: str, statement: str, values: list[float], seeds: list[int], comparison: str, threshold: float):
    """A claim judged by the engine: method m's per-seed values against a constant threshold."""
    spec = claims_lib.parse_claims(
        [
            {
                "id": id,
                "statement": statement,
                "metric": "v",
                "method": "m",
                "comparison": comparison,
                "threshold": threshold,
            }
        ],
        "test",
    )[0]
    rows = [{"seed": s, "method": "m", "metric": "v", "value": v} for s, v in zip(seeds, values, strict=True)]
    return claims_lib.judge(spec, claims_lib.long_table(rows, SCALE), SCALE)


def job(rule: str, wildcards: dict, inputs: list[str], outputs: list[str], wall_s: float) -> None:
    """A real provenance record of a finished job whose outputs are already written."""
    record = build_record(
        rule=rule,
        wildcards=wildcards,
        params={},
        inputs=inputs,
        outputs=outputs,
        generated_roots=["results"],
        started=utc_now(),
        extra={"wall_s": wall_s},
    )
    write_record(record)


def run_paper(slug: str, values: list[float], extra_claim: bool = False) -> Path:
    """One paper's smoke run in the current directory: a train job, then a report job writing metrics.json."""
    out = Path("results") / SCALE / slug
    (out / "models").mkdir(parents=True, exist_ok=True)
    source = Path("sources") / f"{slug}.csv"
    source.parent.mkdir(exist_ok=True)
    source.write_text("x\n1\n")
    model = out / "models" / "m.bin"
    model.write_text(",".join(map(str, values)))
    job(f"{slug}_train", {"seed": "s0-1-2"}, [str(source)], [str(model)], 2.5)
    seeds = list(range(len(values)))
    claims = [
        compare_claim(
            id="err_small", statement="error | below", values=values, seeds=seeds, comparison="<", threshold=THRESHOLD
        )
    ]
    if extra_claim:
        claims.append(
            compare_claim(id="extra", statement="new", values=values, seeds=seeds, comparison=">", threshold=0.0)
        )
    report, metrics = out / "report.md", out / "metrics.json"
    report.write_text("# report\n")
    write_metrics(metrics, paper=slug, scale=SCALE, claims=claims)
    job(f"{slug}_report", {}, [str(model)], [str(report), str(metrics)], 0.5)
    (out / "logs").mkdir(exist_ok=True)
    (out / "logs" / "report.log").write_text("no record by design\n")
    return metrics


@pytest.fixture
def recorded(tmp_path, monkeypatch) -> Path:
    """A clean two-paper tree with its record written by the CLI."""
    monkeypatch.chdir(tmp_path)
    for slug, values in BASE.items():
        run_paper(slug, values)
    bench = Path("results") / SCALE / "ph_x" / "benchmarks"
    bench.mkdir()
    (bench / "train.tsv").write_text("s\th:m:s\tmax_rss\tmean_load\tcpu_time\n3.25\t0:00:03\t100.0\t61.5\t2.0\n")
    assert cli_main(["record", "write", "--scale", SCALE]) == 0
    return tmp_path


def check(capsys, *extra: str) -> tuple[int, str]:
    code = cli_main(["record", "check", "--scale", SCALE, *extra])
    return code, capsys.readouterr().out


def load(tmp: Path) -> dict:
    return json.loads((tmp / "docs" / "results" / f"{SCALE}.json").read_text())


def test_write_records_claims_times_and_commit_and_renders_from_the_json(recorded):
    doc = load(recorded)
    assert set(doc["papers"]) == set(BASE) and doc["scale"] == SCALE
    assert doc["tolerance"]["rtol"] == DEFAULT_RTOL and doc["git_commits"]
    paper = doc["papers"]["ph_x"]
    (claim,) = paper["claims"]
    assert claim["values"] == BASE["ph_x"] and claim["seeds"] == [0, 1, 2]
    assert claim["held"] is True and claim["gated"] is True and claim["threshold"] == THRESHOLD
    assert paper["jobs"] == 2 and paper["jobs_wall_s"] == 2.5 + 0.5
    assert [j["rule"] for j in paper["slowest_jobs"]] == ["ph_x_train", "ph_x_report"]
    assert paper["benchmarks"] == {"jobs": 1, "total_s": 3.25, "cpu_s": 2.0}
    md = (recorded / "docs" / "results" / f"{SCALE}.md").read_text()
    assert md == render_markdown(doc)
    assert "| [ph_x](#ph_x) | 1/1 |" in md and fmt(claim["value"]) in md and "error \\| below" in md


def test_check_passes_on_an_identical_fresh_run(recorded, capsys):
    for slug, values in BASE.items():
        run_paper(slug, values)
    code, out = check(capsys)
    assert code == 0, out
    assert Tolerance().describe() in out and "0 failure(s), 0 warning(s)" in out


def test_check_fails_when_a_value_moves_beyond_the_tolerance(recorded, capsys):
    run_paper("ph_x", [v * (1 + 10 * DEFAULT_RTOL) for v in BASE["ph_x"]])
    code, out = check(capsys)
    assert code == 1
    moved = [line for line in out.splitlines() if line.startswith("FAIL") and "err_small" in line]
    assert {line.split()[3] for line in moved} == {"value", "ci_low", "ci_high", "values[seed"}, out  # mean, CI, seeds
    assert check(capsys, "--rtol", str(100 * DEFAULT_RTOL))[0] == 0  # the tolerance is the only reason


def test_check_fails_when_one_seed_moves_and_the_mean_does_not(recorded, capsys):
    a, b, c = BASE["ph_y"]
    run_paper("ph_y", [b, a, c])
    code, out = check(capsys)
    assert code == 1 and "values[seed 0]" in out and "values[seed 1]" in out and "ph_y" in out


def test_a_flip_far_from_the_threshold_fails(recorded, capsys):
    run_paper("ph_x", [v + THRESHOLD for v in BASE["ph_x"]])
    code, out = check(capsys)
    assert code == 1
    flips = [line for line in out.splitlines() if " held " in f" {line} "]
    assert flips and flips[0].startswith("FAIL") and "True" in flips[0] and "False" in flips[0], out


def test_a_flip_within_the_tolerance_of_the_threshold_warns_and_passes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    near = THRESHOLD * DEFAULT_RTOL / 5
    run_paper("ph_x", [THRESHOLD - near] * 3)
    assert cli_main(["record", "write", "--scale", SCALE]) == 0
    run_paper("ph_x", [THRESHOLD + near] * 3)
    code, out = check(capsys)
    assert code == 0, out
    assert "WARN" in out and "within the tolerance of the threshold" in out and "2 warning(s)" in out  # held, verdict
    run_paper("ph_x", [THRESHOLD + 20 * near] * 3)  # flipped beyond the tolerance: fails
    assert check(capsys)[0] == 1


def test_compare_records_names_the_flip_level():
    def record(value: float) -> dict:
        claim = compare_claim(
            id="c", statement="s", values=[value] * 3, seeds=[0, 1, 2], comparison="<", threshold=THRESHOLD
        )
        return {"papers": {"p": {"claims": [claim.to_json()]}}}

    tol = Tolerance()
    far = [f for f in compare_records(record(THRESHOLD / 2), record(2 * THRESHOLD), tol) if f.what == "held"]
    assert [f.level for f in far] == ["FAIL"]
    assert {f.what: f.level for f in compare_records(record(THRESHOLD / 2), record(2 * THRESHOLD), tol)}[
        "verdict"
    ] == "FAIL"
    edge = THRESHOLD * tol.rtol / 4
    close = compare_records(record(THRESHOLD - edge), record(THRESHOLD + edge), tol)
    assert [(f.what, f.level) for f in close] == [("held", "WARN"), ("verdict", "WARN")]


def test_check_fails_when_a_claim_appears_or_disappears(recorded, capsys):
    run_paper("ph_x", BASE["ph_x"], extra_claim=True)
    code, out = check(capsys)
    assert code == 1 and "appeared" in out and "extra" in out
    run_paper("ph_x", BASE["ph_x"])
    shutil.rmtree(recorded / "results" / SCALE / "ph_y")
    code, out = check(capsys)
    assert code == 1 and "disappeared" in out and "ph_y" in out


def test_write_refuses_a_tampered_metrics_json(recorded, capsys):
    metrics = Path("results") / SCALE / "ph_x" / "metrics.json"
    doc = json.loads(metrics.read_text())
    doc["claims"][0]["held"] = not doc["claims"][0]["held"]
    metrics.write_text(json.dumps(doc))
    before = (recorded / "docs" / "results" / f"{SCALE}.json").read_text()
    assert cli_main(["record", "write", "--scale", SCALE]) == 1
    err = capsys.readouterr().err
    assert "record write refused" in err and f"MISMATCH {metrics}" in err
    assert (recorded / "docs" / "results" / f"{SCALE}.json").read_text() == before
    assert check(capsys)[0] == 1  # the check audits the fresh tree too


def test_write_refuses_a_file_without_a_record(recorded, capsys):
    stray = Path("results") / SCALE / "ph_y" / "figure.png"
    stray.write_bytes(b"png")
    assert cli_main(["record", "write", "--scale", SCALE]) == 1
    assert f"NO RECORD {stray}" in capsys.readouterr().err


def test_check_refuses_a_hand_edited_markdown(recorded, capsys):
    md = recorded / "docs" / "results" / f"{SCALE}.md"
    md.write_text(md.read_text().replace("**held**", "**refuted**"))
    assert cli_main(["record", "check", "--scale", SCALE]) == 1
    assert "is not the rendering of" in capsys.readouterr().err


def test_readme_status_counts_gated_claims_and_marks_scales_not_run():
    record = {
        "papers": {
            "a": {
                "claims": [
                    {"gated": True, "held": True},
                    {"gated": True, "held": False},
                    {"gated": False, "held": True},
                ]
            }
        }
    }
    table = readme_status({"smoke": record}, ["a", "b"], {"a": "Paper A"}).splitlines()
    assert (
        table[2]
        == "| Paper A | [`a`](workflows/a/README.md) | [1 of 2](docs/results/smoke.md#a) | not run | not run | not run |"
    )
    assert table[3] == "| b | [`b`](workflows/b/README.md) | not run | not run | not run | not run |"
    judged = {
        "papers": {
            "a": {
                "claims": [
                    {"id": "h", "gated": True, "held": True, "verdict": "held", "central": True},
                    {"id": "i", "gated": True, "held": False, "verdict": "inconclusive"},
                ]
            }
        }
    }
    row = readme_status({"smoke": judged, "cpu": judged}, ["a"], {}).splitlines()[2]
    assert row == (
        "| a | [`a`](workflows/a/README.md) | [1 of 2](docs/results/smoke.md#a): 1 held, 1 inconclusive "
        "| [1 of 2](docs/results/cpu.md#a): 1 held, 1 inconclusive | not run | `h` held |"
    )


def test_readme_times_give_each_papers_wall_jobs_time_and_cpu_and_sum_the_papers_on_record():
    smoke = {
        "papers": {
            "a": {"wall_clock_s": 90.0, "jobs_wall_s": 150.4, "benchmarks": {"cpu_s": 40.0}},
            "b": {"wall_clock_s": 600, "jobs_wall_s": 9000, "benchmarks": {"cpu_s": 300.0}},
        }
    }
    cpu = {"papers": {"a": {"wall_clock_s": None, "jobs_wall_s": 30.0}}}  # a record from before the CPU field
    table = readme_times({"smoke": smoke, "cpu": cpu}, ["a", "b"]).splitlines()
    assert table[0] == (
        "| paper | `tiny`: wall (jobs' time; CPU) | `smoke`: wall (jobs' time; CPU) | `cpu`: wall (jobs' time; CPU) |"
    )
    assert table[2] == (
        "| [`a`](workflows/a/README.md) | no record | 90 s (2.5 min of jobs; ≥ 40 s of CPU) | wall n/a (30 s of jobs) |"
    )
    assert (
        table[3]
        == "| [`b`](workflows/b/README.md) | no record | 10.0 min (2.5 h of jobs; ≥ 5.0 min of CPU) | no record |"
    )
    assert table[4] == (
        "| all papers on record | no record | 2 papers: 11.5 min (2.5 h of jobs; ≥ 5.7 min of CPU) "
        "| 1 papers: wall n/a (30 s of jobs) |"
    )


def test_benchmark_cpu_is_summed_per_job_as_snakemake_writes_it_and_a_foreign_table_is_refused(tmp_path):
    from paperflow.core.record import RecordError, _benchmarks

    bench = tmp_path / "benchmarks"
    (bench / "nested").mkdir(parents=True)
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    (bench / "a.tsv").write_text(head + "730.72\t0:12:10\t222.32\t1631.60\t152.02\t153.94\t0.01\t32.31\t3.27\t23.97\n")
    (bench / "nested" / "b.tsv").write_text(
        head + "2.0\t0:00:02\t1\t1\t1\t1\t0\t0\t50\t1.0\n4.0\t0:00:04\t1\t1\t1\t1\t0\t0\t50\t3.0\n"
    )
    assert _benchmarks(tmp_path) == {"jobs": 2, "total_s": 733.72, "cpu_s": 25.97}  # repeats averaged: 3.0 s, 2.0 s
    (bench / "c.tsv").write_text("s\th:m:s\n1.0\t0:00:01\n")
    with pytest.raises(RecordError, match=r"c\.tsv is not a Snakemake benchmark table \(KeyError"):
        _benchmarks(tmp_path)


def test_refresh_readme_rewrites_both_generated_blocks_and_refuses_a_readme_without_them(tmp_path):
    from paperflow.core.record import README_BEGIN, README_END, README_TIMES_BEGIN, README_TIMES_END, RecordError

    (tmp_path / "smoke.json").write_text(
        json.dumps({"papers": {"a": {"claims": [], "wall_clock_s": 5, "jobs_wall_s": 7}}})
    )
    readme = tmp_path / "README.md"
    readme.write_text(
        f"top\n{README_BEGIN}\nold\n{README_END}\nmiddle\n{README_TIMES_BEGIN}\nold\n{README_TIMES_END}\nend\n"
    )
    assert refresh_readme(readme, tmp_path, ["a"], tmp_path)
    text = readme.read_text()
    assert "old" not in text and "| [`a`](workflows/a/README.md) | no record | 5 s (7 s of jobs) | no record |" in text
    assert not refresh_readme(readme, tmp_path, ["a"], tmp_path)
    readme.write_text(f"{README_BEGIN}\n{README_END}\n")
    with pytest.raises(RecordError, match="times: end"):
        refresh_readme(readme, tmp_path, ["a"], tmp_path)


def test_write_with_papers_updates_those_entries_and_keeps_the_others(recorded, capsys):
    before = load(recorded)
    run_paper("ph_y", [0.05, 0.1, 0.05])
    run_paper("ph_z", [0.2, 0.2, 0.3])
    # a broken folder of another paper does not stop the update (only the named papers are audited)
    (Path("results") / SCALE / "ph_x" / "models" / "m.bin").write_text("tampered")
    assert cli_main(["record", "write", "--scale", SCALE, "--papers", "ph_y", "ph_z"]) == 0
    doc = load(recorded)
    assert doc["papers"]["ph_x"] == before["papers"]["ph_x"]
    assert doc["papers"]["ph_y"]["claims"][0]["values"] == [0.05, 0.1, 0.05]
    assert set(doc["papers"]) == {"ph_x", "ph_y", "ph_z"}
    assert (recorded / "docs" / "results" / f"{SCALE}.md").read_text() == render_markdown(doc)
    capsys.readouterr()
    assert cli_main(["record", "write", "--scale", SCALE, "--papers", "ph_w"]) != 0
    captured = capsys.readouterr()
    assert "no results folder results/smoke/ph_w" in captured.out + captured.err


def rerecord_on(tmp: Path, slug: str, cpus: list[str] | None) -> None:
    """Rewrite the committed record as if `slug` had been recorded on `cpus` (None: before CPUs were
    recorded), its Markdown re-rendered so that the check accepts it."""
    doc = load(tmp)
    if cpus is None:
        del doc["papers"][slug]["cpus"]
    else:
        doc["papers"][slug]["cpus"] = cpus
    (tmp / "docs" / "results" / f"{SCALE}.json").write_text(json.dumps(doc))
    (tmp / "docs" / "results" / f"{SCALE}.md").write_text(render_markdown(doc))


def test_the_record_names_the_cpu_of_each_paper(recorded):
    doc = load(recorded)
    assert doc["papers"]["ph_x"]["cpus"] == [cpu_label(cpu_state())]
    assert f"on `{cpu_label(cpu_state())}`." in (recorded / "docs" / "results" / f"{SCALE}.md").read_text()


@pytest.mark.parametrize("cpus", [["GenuineIntel Xeon [sse4_2 avx avx2 fma]"], None])
def test_on_another_cpu_moves_warn_and_flips_still_fail(recorded, capsys, cpus):
    rerecord_on(recorded, "ph_x", cpus)
    run_paper("ph_x", [v * (1 + 10 * DEFAULT_RTOL) for v in BASE["ph_x"]])
    run_paper("ph_y", [v * (1 + 10 * DEFAULT_RTOL) for v in BASE["ph_y"]])  # same CPU: still fails
    code, out = check(capsys)
    rows = [line.split() for line in out.splitlines() if line.startswith(("FAIL", "WARN"))]
    assert code == 1 and {(r[0], r[1]) for r in rows} == {("WARN", "ph_x"), ("FAIL", "ph_y")}, out
    assert "another CPU: moves are warnings" in out and "moved (another CPU)" in out
    run_paper("ph_y", BASE["ph_y"])
    assert check(capsys)[0] == 0  # ph_x's moves alone do not fail
    run_paper("ph_x", [v + THRESHOLD for v in BASE["ph_x"]])  # a flip fails on any CPU
    code, out = check(capsys)
    assert code == 1 and any(line.startswith("FAIL") and " held " in line for line in out.splitlines()), out


def test_cpu_state_reads_the_vendor_model_and_dispatch_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    first = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\nflags\t\t: fpu sse4_2 avx2 fma avx512f\n"
    info.write_text(first + "\nprocessor\t: 1\nvendor_id\t: Other\nflags\t\t: avx512_bf16\n")
    cpu = cpu_state(info)
    assert cpu == {"vendor": "AuthenticAMD", "model": "AMD EPYC 9654", "simd": ["sse4_2", "avx2", "fma", "avx512f"]}
    assert cpu_label(cpu) == "AuthenticAMD AMD EPYC 9654 [sse4_2 avx2 fma avx512f]" and cpu_label(None) == "unknown"
    assert cpu_state(tmp_path / "absent")["simd"] == []


def test_cpu_record_is_checked_against_each_papers_code(tmp_path, monkeypatch, capsys):
    """scale cpu is not rerun by CI: its record fails where a paper's own files changed or a paper has no record,
    and warns where only the core moved."""
    from paperflow.core import record as record_lib

    root = tmp_path / "repo"
    for rel in ("workflows/pa/Snakefile", "config/pa.yaml", "modules/paperflow/pa/x.py", "modules/paperflow/core/c.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("a = 1\n")
    (root / "workflows/pa/README.md").write_text("docs do not count\n")
    rec = {"scale": "cpu", "papers": {"pa": {"code_hashes": record_lib.code_hashes(root, "pa")}}}
    assert record_lib.hash_findings(rec, root, ["pa"]) == []
    (root / "workflows/pa/README.md").write_text("edited docs\n")
    assert record_lib.hash_findings(rec, root, ["pa"]) == []
    (root / "modules/paperflow/core/c.py").write_text("a = 2\n")
    assert [(f.level, f.what) for f in record_lib.hash_findings(rec, root, ["pa"])] == [("WARN", "core code")]
    (root / "modules/paperflow/pa/x.py").write_text("a = 2\n")
    found = record_lib.hash_findings(rec, root, ["pa", "pb"])
    assert [(f.paper, f.level, f.what) for f in found] == [
        ("pa", "FAIL", "paper code"),
        ("pa", "WARN", "core code"),
        ("pb", "WARN", "record"),
    ]
    assert "papers=[pa]" in found[0].note and "--papers pa" in found[0].note


def test_on_another_cpu_a_verdict_one_step_away_warns_and_held_to_refuted_fails():
    def record(values: list[float], cpu: str) -> dict:
        claim = compare_claim(
            id="c", statement="s", values=values, seeds=[0, 1, 2], comparison="<", threshold=THRESHOLD
        )
        return {"papers": {"p": {"claims": [claim.to_json()], "cpus": [cpu]}}}

    held, unsure, refuted = [0.1, 0.12, 0.11], [0.1, 0.7, 0.2], [0.9, 0.95, 0.92]
    tol = Tolerance()
    levels = lambda a, b, cpu: {f.what: f.level for f in compare_records(record(a, "x"), record(b, cpu), tol)}  # noqa: E731
    assert levels(held, unsure, "y")["verdict"] == "WARN" and levels(held, unsure, "y")["held"] == "WARN"
    assert levels(held, unsure, "x")["verdict"] == "FAIL"  # the recording CPU: strict
    assert levels(held, refuted, "y")["verdict"] == "FAIL"


def test_wall_clock_is_the_union_of_the_jobs_intervals():
    from paperflow.core.record import _wall_clock

    def job(a: int, b: int) -> dict:
        return {"started": f"2026-01-01T00:{a:02d}:00", "ended": f"2026-01-01T00:{b:02d}:00"}

    # two overlapping jobs (0-10, 5-12 min), then a report rerun 30 minutes later (42-43): 12 + 1 minutes
    assert _wall_clock([job(0, 10), job(5, 12), job(42, 43)]) == 13 * 60.0
    assert _wall_clock([job(3, 4)]) == 60.0
    assert _wall_clock([]) is None and _wall_clock([{"started": "x"}]) is None


def test_record_refuses_results_made_by_other_paper_code(tmp_path):
    """A job whose script or imported module of the paper differs from the checkout is named (the record's
    code hash is the checkout's, so such results would pass `record check` while coming from other code);
    core modules and other papers' files are not the paper's and do not count."""
    from paperflow.core.download import sha256_file
    from paperflow.core.record import paper_code_drift

    mod = tmp_path / "modules/paperflow/px/method.py"
    script = tmp_path / "workflows/px/scripts/train.py"
    for path in (mod, script):
        path.parent.mkdir(parents=True)
        path.write_text("x = 1\n")
    sha_mod, sha_script = sha256_file(mod), sha256_file(script)
    job = {
        "rule": "px_train",
        "code": {
            "script": {"path": "workflows/px/scripts/train.py", "sha256": sha_script},
            "modules": {"paperflow/px/method.py": sha_mod, "paperflow/core/io.py": "0" * 64, "paperflow/py/a.py": "1"},
        },
    }
    assert paper_code_drift(tmp_path, "px", [job]) == []
    mod.write_text("x = 2\n")
    (drift,) = paper_code_drift(tmp_path, "px", [job])
    assert drift.startswith("rule px_train: modules/paperflow/px/method.py (recorded ") and sha_mod[:12] in drift
    mod.unlink()
    assert paper_code_drift(tmp_path, "px", [job]) == [
        f"rule px_train: modules/paperflow/px/method.py (recorded {sha_mod[:12]}, now absent)"
    ]
    mod.write_text("x = 1\n")
    script.write_text("y = 1\n")
    assert paper_code_drift(tmp_path, "px", [job])[0].startswith("rule px_train: workflows/px/scripts/train.py")
