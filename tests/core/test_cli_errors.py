"""Every error of the `paperflow` CLI is one line on stderr (the file or argument, the problem, what to do) with a
non-zero exit code, never a traceback: the named cases of issue 43 (a record that is not UTF-8, lacks `outputs`,
is `[]`, has a null hash or is truncated; a missing file; a bad `--scale`, `--rtol` or `--atol`), then property
tests (hypothesis) that feed `audit`, `lineage`, `record check` and `plan` random bytes, random JSON, truncated
and mutated real records and random arguments. The CLI's `main` runs in-process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_record import BASE, SCALE, run_paper

from paperflow.core.cli import main as cli_main
from paperflow.core.config import SCALES, available_papers
from paperflow.core.download import sha256_file
from paperflow.core.provenance import SUFFIX, UnreadableRecord, check_record_shape, record_path

# what a line on stderr may start with: a problem found (audit's FAIL lines) or a one-line error
ERROR_LINE = re.compile(r"^(FAIL [A-Z ]+ |paperflow [a-z ]+: |lineage: |plan: |record (check|write|readme) refused: )")
# The same 25 examples on every run (a landing must not hinge on which examples a run drew); set
# PAPERFLOW_PROPERTY_RANDOM=1 to draw new ones while working on the CLI.
PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=os.environ.get("PAPERFLOW_PROPERTY_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow],
)


def run(*argv: str) -> tuple[int, str, str]:
    """`paperflow argv` in-process: its exit code, stdout and stderr, checked for the one-line error form."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(list(argv))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
    o, e = out.getvalue(), err.getvalue()
    assert "Traceback" not in o + e, (argv, o, e)
    assert "unexpected" not in e, (argv, e)  # the safety net in `main` is for what nobody foresaw
    for line in e.splitlines():
        assert ERROR_LINE.match(line), (argv, line)
    if code:  # an error on stderr, or a check's report of what failed
        assert e.strip() or " FAILED: " in o, (argv, code, o)
    return code, o, e


@pytest.fixture(scope="module")
def real_tree(tmp_path_factory) -> Path:
    """A recorded two-paper smoke tree (test_record's synthetic papers) with its committed record."""
    root = tmp_path_factory.mktemp("tree")
    with contextlib.chdir(root):
        for slug, values in BASE.items():
            run_paper(slug, values)
        assert run("record", "write", "--scale", SCALE)[0] == 0
    return root


@contextlib.contextmanager
def copy_of(tree: Path):
    """A scratch copy of `tree`, the current directory while the block runs."""
    with tempfile.TemporaryDirectory() as scratch:
        dest = Path(scratch) / "w"
        shutil.copytree(tree, dest)
        with contextlib.chdir(dest):
            yield dest


def records_of(tree: Path) -> list[Path]:
    return sorted(p.relative_to(tree) for p in (tree / "results").rglob(f"*{SUFFIX}"))


def data_of(rec: Path) -> Path:
    return rec.with_name(rec.name.removesuffix(SUFFIX))


# -- the named cases ------------------------------------------------------------------------------------------


def _not_utf8(text: str) -> bytes:
    return b"\xff\xfe" + text.encode()


def _without_outputs(text: str) -> bytes:
    return json.dumps({k: v for k, v in json.loads(text).items() if k != "outputs"}).encode()


def _null_hash(text: str) -> bytes:
    record = json.loads(text)
    record["outputs"][0]["sha256"] = None
    return json.dumps(record).encode()


CORRUPTIONS = {
    "not UTF-8": (_not_utf8, "not UTF-8"),
    "no outputs": (_without_outputs, "lacks 'outputs'"),
    "a list": (lambda text: b"[]", "a JSON list"),
    "null hash": (_null_hash, "sha256 is null"),
    "truncated": (lambda text: text[: len(text) // 2].encode(), "not valid JSON (truncated?)"),
}


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_a_corrupted_record_is_one_unreadable_record_line(real_tree, case):
    corrupt, says = CORRUPTIONS[case]
    with copy_of(real_tree):
        metrics = Path("results", SCALE, "ph_x", "metrics.json")
        rec = record_path(metrics)
        rec.write_bytes(corrupt(rec.read_text()))
        code, _, err = run("audit", str(metrics))
        assert code == 1 and err.count("\n") == 1
        assert err.startswith(f"FAIL UNREADABLE RECORD {rec.resolve()}: ") and says in err, err
        assert "NO RECORD" not in err and "rerun the job" in err
        code, out, err = run("lineage", str(metrics))
        assert code == 1 and not out and err.count("\n") == 1
        assert err.startswith(f"lineage: unreadable record {rec}: ") and says in err, err
        # the tree and the record built from it say the same, one line per problem
        code, _, err = run("audit", "results")
        assert code == 1 and f"UNREADABLE RECORD {rec.resolve()}: " in err
        code, _, err = run("record", "check", "--scale", SCALE)
        assert code == 1 and "UNREADABLE RECORD" in err and "record check refused: the audit of" in err


def test_an_unreadable_upstream_record_fails_lineage_after_the_tree(real_tree):
    with copy_of(real_tree):
        model = Path("results", SCALE, "ph_x", "models", "m.bin")
        record_path(model).write_text("{")
        code, out, err = run("lineage", str(Path("results", SCALE, "ph_x", "metrics.json")))
        assert code == 1 and f"{model}  [unreadable record]" in out
        assert err.startswith(f"lineage: unreadable record {record_path(model)}: not valid JSON")


def test_a_missing_file_is_no_such_file_and_an_unrecorded_one_no_record(real_tree):
    with copy_of(real_tree):
        code, _, err = run("audit", "results/nothere.txt")
        assert (
            code == 1
            and err
            == "FAIL NO SUCH FILE results/nothere.txt: nothing at this path nor a record of it; check the path\n"
        )
        code, _, err = run("lineage", "results/nothere.txt")
        assert code == 1 and err == "lineage: no such file results/nothere.txt; check the path\n"
        Path("results/stray.txt").write_text("x")
        code, _, err = run("audit", "results/stray.txt")
        assert code == 1 and err.startswith("FAIL NO RECORD results/stray.txt: no provenance record") and "rerun" in err
        code, _, err = run("lineage", "results/stray.txt")
        assert code == 1 and err.startswith("lineage: no provenance record results/stray.txt.prov.json")
        code, _, err = run("lineage", "results")
        assert code == 2 and "is a directory" in err


@pytest.mark.parametrize(
    "argv",
    [
        ("plan", "--scale", "nonsense"),
        ("record", "check", "--scale", "nonsense"),
        ("record", "write", "--scale", "nonsense"),
        ("pin", "ph_vae", "--scale", "nonsense"),
    ],
)
def test_a_bad_scale_is_one_line_listing_the_scales(argv):
    code, _, err = run(*argv)
    assert code == 2 and err.count("\n") == 1
    assert "no scale 'nonsense'; the scales are tiny, smoke, cpu, paper" in err and "--help" in err


@pytest.mark.parametrize("option", ["--rtol", "--atol"])
@pytest.mark.parametrize("value", ["-1", "-1e-9", "nan", "inf", "abc"])
def test_a_bad_tolerance_is_refused_in_one_line(option, value):
    for given_as in ((option, value), (f"{option}={value}",)):  # argparse takes `-1e-9` alone for an option
        code, _, err = run("record", "check", "--scale", SCALE, *given_as)
        assert code == 2 and err.count("\n") == 1
        if given_as[-1] != "-1e-9":
            assert f"argument {option}: {value!r} is not a tolerance; give a finite number >= 0" in err


def test_a_failed_dry_run_is_one_line(monkeypatch):
    import subprocess

    from paperflow.core import plan

    def failed(cmd, **kwargs):
        stderr = 'ConfigError in file "x", line 1:\n  config/ph_vae.yaml: bad\n  File "y", line 2, in z\n'
        return subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(plan.subprocess, "run", failed)
    code, _, err = run("plan", "ph_vae", "--scale", "tiny")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("plan: Snakemake's dry run at scale tiny failed (exit 1): config/ph_vae.yaml: bad; run `")


# -- property tests -------------------------------------------------------------------------------------------

KEYS = st.sampled_from(["rule", "outputs", "inputs", "path", "sha256", "source", "wildcards", "code", "params"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=6), inner, max_size=5),
    max_leaves=16,
)


def _is_record(doc: bytes) -> bool:
    try:
        check_record_shape(Path("x"), json.loads(doc.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, UnreadableRecord):
        return False
    return True


@PROPERTY
@given(content=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_audit_and_lineage_refuse_random_records_in_one_line(content):
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        Path("out.txt").write_text("data")
        Path("out.txt" + SUFFIX).write_bytes(content)
        bad = not _is_record(content)
        for command in ("audit", "lineage"):
            code, _, err = run(command, "out.txt")
            if bad:
                assert code == 1 and err.count("\n") == 1 and "unreadable record" in err.lower(), err
        code, _, _ = run("audit", ".")
        assert code == 1  # the tree: an unreadable record, or one that does not list its file


@PROPERTY
@given(data=st.data())
def test_truncated_real_records_are_unreadable_everywhere(real_tree, data):
    with copy_of(real_tree) as tree:
        rec = data.draw(st.sampled_from(records_of(tree)))
        text = rec.read_bytes()
        rec.write_bytes(text[: data.draw(st.integers(0, len(text) - 1))])
        code, _, err = run("audit", str(data_of(rec)))
        assert code == 1 and err.startswith("FAIL UNREADABLE RECORD ") and "NO RECORD" not in err
        code, _, err = run("lineage", str(data_of(rec)))
        assert code == 1 and err.startswith("lineage: unreadable record ")
        assert run("audit", "results")[0] == 1
        assert run("record", "check", "--scale", SCALE)[0] == 1
        assert run("lineage", str(Path("results", SCALE, rec.parts[2], "metrics.json")))[0] in (0, 1)


def _mutate(doc, data: st.DataObject):
    """`doc` with one value somewhere in it replaced by random JSON, or one key dropped."""
    if isinstance(doc, dict) and doc and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(doc)))
        if data.draw(st.booleans()):
            return {k: v for k, v in doc.items() if k != key}
        return {**doc, key: _mutate(doc[key], data)}
    if isinstance(doc, list) and doc and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(doc) - 1))
        return [*doc[:i], _mutate(doc[i], data), *doc[i + 1 :]]
    return data.draw(JSON)


@PROPERTY
@given(data=st.data())
def test_mutated_real_records_never_give_a_traceback(real_tree, data):
    with copy_of(real_tree) as tree:
        rec = data.draw(st.sampled_from(records_of(tree)))
        rec.write_text(json.dumps(_mutate(json.loads(rec.read_text()), data)))
        for argv in (
            ("audit", str(data_of(rec))),
            ("lineage", str(data_of(rec))),
            ("audit", "results"),
            ("record", "check", "--scale", SCALE),
        ):
            run(*argv)


@PROPERTY
@given(data=st.data())
def test_record_check_refuses_a_corrupted_committed_record_or_metrics_in_one_line(real_tree, data):
    with copy_of(real_tree):
        committed = Path("docs", "results", f"{SCALE}.json")
        metrics = Path("results", SCALE, data.draw(st.sampled_from(sorted(BASE))), "metrics.json")
        victim = data.draw(st.sampled_from(["committed", "metrics"]))
        path = committed if victim == "committed" else metrics
        how = data.draw(st.sampled_from(["bytes", "json", "mutated"]))
        if how == "bytes":
            new = data.draw(st.binary(max_size=200))
        elif how == "json":
            new = json.dumps(data.draw(JSON)).encode()
        else:
            new = json.dumps(_mutate(json.loads(path.read_text()), data)).encode()
        assume(new != path.read_bytes())
        path.write_bytes(new)
        if victim == "metrics":  # rewritten with its records, so that the audit passes and the metrics are read
            for rec in (record_path(metrics), record_path(metrics.with_name("report.md"))):
                doc = json.loads(rec.read_text())
                for out in doc["outputs"]:
                    if out["path"] == str(metrics):
                        out["sha256"] = sha256_file(metrics)
                rec.write_text(json.dumps(doc))
        code, _, err = run("record", "check", "--scale", SCALE)
        if how != "mutated":
            assert code == 1 and err.count("\n") == 1 and err.startswith("record check refused: "), err
        if victim == "metrics":
            code, _, err = run("record", "write", "--scale", SCALE, "--out", "elsewhere")
            if how != "mutated":
                assert code == 1 and err.count("\n") == 1 and err.startswith("record write refused: "), err


@PROPERTY
@given(
    scale=st.text(max_size=10).filter(lambda s: s not in SCALES),
    papers=st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3),
    good_scale=st.sampled_from(SCALES),
    rtol=st.text(max_size=8) | st.floats().map(str),
)
def test_random_arguments_are_one_line_errors(scale, papers, good_scale, rtol):
    known = set(available_papers())
    assume(not set(papers) <= known)  # a plan of real papers runs Snakemake's dry run
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        for argv in (
            ("plan", "--scale", scale),
            ("plan", "--scale", good_scale, "--", *papers),
            ("record", "check", "--scale", scale),
            ("record", "check", "--scale", good_scale, "--rtol", rtol),
            ("record", "check", "--scale", good_scale, f"--atol={rtol}"),
            ("audit", "--", papers[0]),
            ("lineage", "--", papers[0]),
        ):
            code, _, err = run(*argv)
            assert code != 0 and err.count("\n") == 1, (argv, err)
