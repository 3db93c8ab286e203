"""Provenance records, audit of a file and of a tree (pass, tamper, missing record, unrecorded file)
and the code-hash rerun param."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from paperflow.core import codehash
from paperflow.core.cli import main as cli_main
from paperflow.core.provenance import audit, build_record, lineage, read_record, record_path, utc_now, write_record


def make_job(tmp: Path, rule: str, inputs: list[Path], outputs: dict[str, str], temporary=()) -> list[Path]:
    paths = []
    for name, text in outputs.items():
        p = tmp / "results" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        paths.append(p)
    rec = build_record(
        rule=rule,
        wildcards={"w": 1},
        params={"lr": 0.1},
        inputs=[str(i) for i in inputs],
        outputs=[str(p) for p in paths],
        generated_roots=[str(tmp / "results")],
        started=utc_now(),
        temporary=[str(tmp / "results" / n) for n in temporary],
    )
    write_record(rec)
    return paths


@pytest.fixture
def chain(tmp_path):
    source = tmp_path / "source.csv"
    source.write_text("1,2,3\n")
    (raw,) = make_job(tmp_path, "download", [source], {"raw.txt": "raw"})
    train, test = make_job(tmp_path, "preprocess", [raw], {"train.txt": "tr", "test.txt": "te"})
    (model,) = make_job(tmp_path, "train", [train], {"model.bin": "weights"})
    report, metrics = make_job(tmp_path, "report", [model, test], {"report.md": "# r", "metrics.json": '{"held": 1}'})
    return {
        "source": source,
        "raw": raw,
        "train": train,
        "test": test,
        "model": model,
        "report": report,
        "metrics": metrics,
    }


def test_record_has_hashes_params_and_environment(chain):
    rec = read_record(chain["model"])
    assert rec["rule"] == "train" and rec["params"] == {"lr": 0.1} and rec["wildcards"] == {"w": 1}
    assert rec["outputs"][0]["sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert rec["inputs"][0] == {
        "path": str(chain["train"]),
        "sha256": hashlib.sha256(b"tr").hexdigest(),
        "bytes": 2,
        "source": False,
    }
    assert rec["environment"]["python"] and "numpy" in rec["environment"]["packages"]
    assert rec["host"]["hostname"] and rec["started"] <= rec["ended"]
    # one job, two outputs: the same record beside each
    assert read_record(chain["train"]) == read_record(chain["test"])


def test_audit_walks_back_to_the_source(chain):
    report = audit(chain["report"])
    assert report.ok, report.problems
    assert set(report.rules.values()) == {"download", "preprocess", "train", "report"}
    assert report.sources == [str(chain["source"])]


@pytest.mark.parametrize("victim", ["raw", "train", "model", "source", "report"])
def test_audit_fails_and_names_a_tampered_file(chain, victim, capsys):
    chain[victim].write_text("tampered")
    report = audit(chain["report"])
    assert not report.ok
    assert any(str(chain[victim]) in p and p.startswith("MISMATCH") for p in report.problems)
    assert cli_main(["audit", str(chain["report"])]) == 1
    assert str(chain[victim]) in capsys.readouterr().err


def test_audit_of_a_report_covers_the_other_outputs_of_its_job(chain, capsys):
    chain["metrics"].write_text('{"held": 0}')
    report = audit(chain["report"])
    assert [p for p in report.problems if p.startswith(f"MISMATCH {chain['metrics']}:")], report.problems
    assert cli_main(["audit", str(chain["report"])]) == 1
    assert f"MISMATCH {chain['metrics']}" in capsys.readouterr().err
    chain["metrics"].unlink()
    assert any(p.startswith(f"MISSING {chain['metrics']}") for p in audit(chain["report"]).problems)


def test_tree_audit_passes_on_a_clean_tree_and_ignores_logs_and_benchmarks(chain, capsys):
    results = chain["report"].parent
    for folder in ("logs/train", "benchmarks", ".snakemake"):
        (results / folder).mkdir(parents=True)
        (results / folder / "x.txt").write_text("no record by design")
    report = audit(results)
    assert report.ok, report.problems
    assert report.jobs == 4 and set(report.rules.values()) == {"download", "preprocess", "train", "report"}
    assert len(report.checked) == 6  # every output under the tree
    assert cli_main(["audit", str(results)]) == 0
    assert "audit OK" in capsys.readouterr().out


@pytest.mark.parametrize("victim", ["raw", "test", "metrics"])
def test_tree_audit_fails_and_names_a_tampered_file(chain, victim, capsys):
    chain[victim].write_text("tampered")
    report = audit(chain["report"].parent)
    assert any(p.startswith(f"MISMATCH {chain[victim]}:") for p in report.problems), report.problems
    assert cli_main(["audit", str(chain["report"].parent)]) == 1
    assert str(chain[victim]) in capsys.readouterr().err


def test_tree_audit_names_a_file_without_a_record(chain, capsys):
    stray = chain["report"].parent / "tables" / "extra.csv"
    stray.parent.mkdir()
    stray.write_text("a,b\n")
    report = audit(chain["report"].parent)
    assert report.problems == [f"NO RECORD {stray}: a file under {chain['report'].parent} that no job recorded"]
    assert cli_main(["audit", str(chain["report"].parent)]) == 1
    assert str(stray) in capsys.readouterr().err


def test_tree_audit_fails_on_a_tree_without_records(tmp_path):
    (tmp_path / "empty").mkdir()
    assert audit(tmp_path / "empty").problems == [
        f"NO RECORD {tmp_path / 'empty'}: no provenance record anywhere under it"
    ]


def test_audit_fails_on_a_missing_record_or_file(chain):
    record_path(chain["raw"]).unlink()
    assert any(p.startswith(f"NO RECORD {chain['raw']}") for p in audit(chain["report"]).problems)
    chain["model"].unlink()
    assert any(p.startswith(f"MISSING {chain['model']}") for p in audit(chain["report"]).problems)


def test_a_deleted_temporary_output_passes_the_audit_while_its_records_agree(tmp_path):
    """A temp() output (Snakemake deletes it once its consumers ran) marked temporary by its producer: the audit
    accepts it gone, walks on to its producer, and still fails when the consumer's record of it disagrees with the
    producer's; the same file gone without the mark is MISSING."""
    source = tmp_path / "source.csv"
    source.write_text("1\n")
    (model,) = make_job(tmp_path, "train", [source], {"model.bin": "weights"}, temporary=["model.bin"])
    (score,) = make_job(tmp_path, "evaluate", [model], {"score.json": "{}"})
    assert read_record(model)["outputs"][0]["temporary"] is True and "temporary" not in read_record(score)["outputs"][0]
    model.unlink()
    report = audit(score)
    assert report.ok, report.problems
    assert report.deleted == [str(model)] and set(report.rules.values()) == {"train", "evaluate"}
    assert report.sources == [str(source)]
    consumer = read_record(score)
    consumer["inputs"][0]["sha256"] = "0" * 64  # the evaluation read other bytes than the training wrote
    write_record(consumer)
    assert any(p.startswith(f"MISMATCH {model}: a deleted temporary file") for p in audit(score).problems)
    (plain,) = make_job(tmp_path, "train2", [source], {"plain.bin": "w"})
    (score2,) = make_job(tmp_path, "evaluate2", [plain], {"score2.json": "{}"})
    plain.unlink()
    assert any(p.startswith(f"MISSING {plain}") for p in audit(score2).problems)


def test_lineage_lists_every_job(chain):
    text = "\n".join(lineage(chain["report"]))
    for rule in ("report", "train", "preprocess", "download"):
        assert f"rule {rule}" in text
    assert "[source]" in text


def test_code_closure_follows_imports_transitively(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("from paperflow.ph_vae.evaluation import evaluate\n")
    names = [n for n, _ in codehash.module_closure(script)]
    assert "paperflow.ph_vae.model" in names and "paperflow.ph_vae.phase_type" in names  # via checkpoint
    assert "paperflow.ph_vae.training" not in names  # evaluation never imports Lightning training


def test_code_hash_changes_with_an_imported_module(tmp_path, monkeypatch):
    pkg = tmp_path / "paperflow"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("X = 1\n")
    script = tmp_path / "s.py"
    script.write_text("from paperflow.sub.a import *\n")
    monkeypatch.setattr(codehash, "PACKAGE_DIR", pkg)
    before = codehash.code_hash(script)
    (pkg / "sub" / "b.py").write_text("X = 2\n")
    assert codehash.code_hash(script) != before


DOC = '{"rule": "train", "params": {"lr": 0.001, "name": "a \\"quoted\\" word"}, "outputs": [1, 2.5, null]}'


@pytest.mark.parametrize("cut", range(1, len(DOC)))
def test_every_prefix_of_a_json_document_reads_as_truncated(tmp_path, cut):
    """Wherever a write stopped (inside a key, a string, a number, between items), the one-line error says
    "(truncated?)": CI once cut a record inside a string, where the parser points at the opening quote."""
    from paperflow.core.provenance import read_json_file

    path = tmp_path / "r.json"
    path.write_text(DOC[:cut])
    with pytest.raises(ValueError, match=r"^\S+r\.json: (not valid JSON \(truncated\?\): .+|empty); fix$") as err:
        read_json_file(path, "fix")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ['{"a": 1,, "b": 2}', '{"a": 1} x', "[1, 2] ]", '{"a" 1}'])
def test_json_broken_in_the_middle_is_not_called_truncated(tmp_path, bad):
    from paperflow.core.provenance import read_json_file

    path = tmp_path / "r.json"
    path.write_text(bad)
    with pytest.raises(ValueError, match="not valid JSON: ") as err:
        read_json_file(path, "fix")
    assert "truncated" not in str(err.value)


def test_a_missing_json_file_is_an_error_or_passes_through(tmp_path):
    from paperflow.core.provenance import read_json_file

    with pytest.raises(ValueError, match="missing; fix"):
        read_json_file(tmp_path / "none.json", "fix")
    with pytest.raises(FileNotFoundError):
        read_json_file(tmp_path / "none.json", "fix", missing_raises=True)


def test_a_job_marks_the_outputs_its_rule_declares_temporary_and_refuses_an_unknown_name(tmp_path):
    """snakemake_job reads `params.temporary` (a script sees no temp() flags): the named outputs are marked in the
    record; a name that is no output of the rule fails the job by name."""
    from snakemake.iocontainers import Namedlist

    from paperflow.core.job import snakemake_job

    def smk(temporary):
        out = Namedlist(fromdict={"models": str(tmp_path / "m.bin"), "curve": str(tmp_path / "c.csv")})
        params = {"temporary": temporary, "code": {"hash": "abc", "generated_roots": [str(tmp_path)]}}
        return type(
            "Smk",
            (),
            {
                "rule": "x_train",
                "input": Namedlist([]),
                "output": out,
                "params": Namedlist(fromdict=params),
                "wildcards": Namedlist(fromdict={}),
                "threads": 1,
                "log": Namedlist([]),
            },
        )()

    with snakemake_job(smk(["models"])) as job:
        for path in job.output:
            Path(path).write_text("x")
    marks = {Path(o["path"]).name: o.get("temporary", False) for o in read_record(tmp_path / "c.csv")["outputs"]}
    assert marks == {"m.bin": True, "c.csv": False}
    with pytest.raises(ValueError, match=r"params.temporary names \['weights'\], not outputs"):
        with snakemake_job(smk(["weights"])) as job:
            for path in job.output:
                Path(path).write_text("x")
