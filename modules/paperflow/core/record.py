"""Results on record: `docs/results/<scale>.json` and `.md`, the one place outcomes are written down.

`write_record` audits the tree `results/<scale>` first (`paperflow.core.provenance.audit_tree`: every
record, every output of every job, and no data file without a record) and refuses on any problem, so
the record is built from audited metrics only. It then reads every `results/<scale>/<slug>/metrics.json`
and writes one JSON document: per paper its claims (id, statement, seeds and per-seed values, the
aggregate value, threshold, comparison, held, gated), the git commit and dirty flag of the job that
wrote the metrics, the time of its jobs and its slowest jobs, and the tolerance `check_record` uses.
The Markdown is rendered from that JSON document only; no number in it is typed.

Times come from the provenance records: a job's `wall_s` is the time inside its script (interpreter
start and imports excluded), and a paper's time is the sum over its jobs, i.e. the time one core would
spend on the paper's work. Snakemake's `benchmark:` TSVs under `<slug>/benchmarks/` time whole job
processes, start-up included, for the rules that have one; their column `s` is summed beside it.

`check_record` builds the same document from a fresh tree and compares it with the committed one.
A claim fails the check when it appears or disappears, when its definition (gated, comparison,
aggregate, seeds) changes, when its value, threshold or any per-seed value moves beyond the tolerance,
or when it flips held / not held. A flip whose fresh value lies within the tolerance of the threshold
is a warning only: another CPU's rounding must not block a landing.

Each paper's entry names the CPU(s) its jobs ran on (`provenance.cpu_state`: vendor, model, the SIMD
extensions numeric libraries dispatch on). Where the fresh run's CPUs differ from the recorded ones,
moved values are warnings, not failures, and one warning per paper says so, as is a verdict that moved one step
(held or refuted <-> inconclusive, or the control's verdict crossing); held <-> refuted, definitions and
claims that come or go still fail. The reason is measured, not assumed: the same commit run on an
AVX512 AMD EPYC and on the machine that wrote the previous record gave uka's seed 2 one episode in
150 apart and mtbl_wc's best-iterate KKT rate ratio 2.87 vs 3.65, every other paper within 1e-3.
On one machine, capping torch's kernels (ATEN_CPU_CAPABILITY=avx2 or ONEDNN_MAX_CPU_ISA=AVX2) changes
uka's MiniLM vectors by 2e-7 and its outcome by percents (nearest-neighbour retrieval turns last-bit
differences into other choices), and MKL's code path (MKL_CBWR=COMPATIBLE) moves mtbl_wc's rate ratio
from 2.87 to 3.65 in float64. A record is therefore a strict reference on the CPU that wrote it only.

The tolerance: |fresh - recorded| <= atol + rtol * |recorded|, with rtol = 1e-3 and atol = 1e-9 by
default. Smoke runs are seeded end to end, and on one machine a rerun reproduces metrics.json byte for
byte, so any real change of code, data, seeds or hyperparameters shows up far above 1e-3 (such changes
move the metrics by percents). What 1e-3 absorbs is floating-point reordering on another CPU or BLAS
build (last bits, amplified by a few training epochs to about 1e-5..1e-4 relative). The absolute
1e-9 keeps values that are exactly zero comparable without letting anything real through.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paperflow.core.download import sha256_file
from paperflow.core.provenance import (
    UnreadableRecord,
    audit_tree,
    cpu_label,
    job_records,
    read_json_file,
    read_record,
)
from paperflow.core.report import fmt

SCHEMA = "paperflow.results/1"
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-9
SLOWEST = 3  # jobs listed per paper
REQUIRED_CLAIM_KEYS = (
    "id",
    "statement",
    "metric",
    "method",
    "baseline",
    "effect",
    "unit",
    "aggregate",
    "seeds",
    "values",
    "baseline_values",
    "effects",
    "value",
    "value_std",
    "threshold",
    "comparison",
    "ci_low",
    "ci_high",
    "ci_level",
    "ci_method",
    "n_units",
    "n_needed",
    "verdict",
    "held",
    "gated",
    "central",
    "control",
)
DEFINITION_KEYS = (
    "gated",
    "comparison",
    "aggregate",
    "seeds",
    "metric",
    "method",
    "baseline",
    "effect",
    "unit",
)  # compared exactly by the check
NUMBER_KEYS = ("value", "threshold", "ci_low", "ci_high")  # compared within the tolerance by the check
HASH_CHECKED_SCALES = ("cpu",)  # scales CI does not rerun: their record is checked against the code's hashes


class RecordError(RuntimeError):
    """The record cannot be written or checked (a failed audit, a malformed metrics.json, ...). The message is
    one line; `problems` lists what a failed audit found."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems)


# what a malformed document raises when read as if it were well formed
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError)


def read_json(path: str | Path, remedy: str) -> Any:
    """The JSON document at `path`; raises RecordError (one line: the file, the problem and `remedy`) when it
    is missing, cannot be read, is not UTF-8 or is not JSON (`provenance.read_json_file`)."""
    return read_json_file(path, remedy, RecordError)


def _shape_error(path: str | Path, exc: Exception, remedy: str) -> RecordError:
    detail = " ".join(str(exc).split())[:200]
    return RecordError(f"{path}: not in the form this version reads ({type(exc).__name__}: {detail}); {remedy}")


@dataclass(frozen=True)
class Tolerance:
    """How far a fresh number may lie from the recorded one: atol + rtol * |recorded|."""

    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    def allowed(self, reference: float) -> float:
        return self.atol + self.rtol * abs(reference)

    def close(self, recorded: float | None, fresh: float | None) -> bool:
        """Whether `fresh` is within the tolerance of `recorded`; a missing (non-finite) value is only
        close to another missing one."""
        if recorded is None or fresh is None:
            return recorded is None and fresh is None
        return abs(fresh - recorded) <= self.allowed(recorded)

    def describe(self) -> str:
        return f"|fresh - recorded| <= atol + rtol * |recorded|, rtol={self.rtol:g}, atol={self.atol:g}"

    def to_json(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "atol": self.atol, "rule": "|fresh - recorded| <= atol + rtol * |recorded|"}


def record_paths(record_dir: str | Path, scale: str) -> tuple[Path, Path]:
    """The JSON and Markdown files of the record of `scale`."""
    return Path(record_dir) / f"{scale}.json", Path(record_dir) / f"{scale}.md"


def _claim_entry(claim: Mapping[str, Any], source: Path) -> dict[str, Any]:
    missing = [k for k in REQUIRED_CLAIM_KEYS if k not in claim]
    if missing:
        raise RecordError(f"{source}: claim {claim.get('id', '?')!r} lacks {', '.join(missing)}")
    if len(claim["values"]) != len(claim["seeds"]):
        raise RecordError(
            f"{source}: claim {claim['id']!r} has {len(claim['values'])} values for {len(claim['seeds'])} seeds"
        )
    return {k: claim[k] for k in REQUIRED_CLAIM_KEYS}


def _job_time(record: Mapping[str, Any], paper_dir: Path) -> dict[str, Any]:
    if "wall_s" not in record:
        raise RecordError(f"a record of rule {record['rule']} under {paper_dir} has no wall_s")
    return {"rule": record["rule"], "wildcards": record["wildcards"], "wall_s": record["wall_s"]}


def _benchmarks(paper_dir: Path) -> dict[str, Any]:
    """The benchmarked jobs of a paper, the sum of their `s` (the mean over a TSV's repeats) and of their
    `cpu_time`: the CPU seconds of each job's process tree as Snakemake's benchmark last sampled it (every 30 s
    after a short start, so up to one interval of a job's end is missed: a lower bound). Unlike wall times it does
    not grow while a job waits for a core, so it tells a slow paper from a loaded machine."""
    seconds, cpu = [], []
    for tsv in sorted((paper_dir / "benchmarks").rglob("*.tsv")):
        with tsv.open(newline="") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows:
            raise RecordError(f"benchmark {tsv} has no rows")
        try:
            seconds.append(sum(float(row["s"]) for row in rows) / len(rows))
            cpu.append(sum(float(row["cpu_time"]) for row in rows) / len(rows))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(
                f"benchmark {tsv} is not a Snakemake benchmark table ({type(exc).__name__}: {exc}); rerun its job"
            ) from None
    return {"jobs": len(seconds), "total_s": round(float(sum(seconds)), 3), "cpu_s": round(float(sum(cpu)), 3)}


def _wall_clock(jobs: Sequence[Mapping[str, Any]]) -> float | None:
    """Seconds during which at least one of the paper's jobs ran: the union of the jobs' intervals. A report
    rerun hours later adds its own seconds, not the idle gap before it (first start to last end would)."""
    from datetime import datetime

    try:
        spans = sorted((datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"])) for r in jobs)
    except (KeyError, TypeError, ValueError):
        return None
    if not spans:
        return None
    total, (start, end) = 0.0, spans[0]
    for s, e in spans[1:]:
        if s > end:
            total += (end - start).total_seconds()
            start, end = s, e
        else:
            end = max(end, e)
    return round(total + (end - start).total_seconds(), 1)


PAPER_EXCLUDED_SUFFIXES = (".md", ".pyc")


def _files_under(root: Path, rel: str) -> list[Path]:
    base = root / rel
    if base.is_file():
        return [base]
    return sorted(
        p
        for p in base.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(PAPER_EXCLUDED_SUFFIXES)
    )


def paper_code_files(root: Path, slug: str) -> list[Path]:
    """A paper's own files: its workflow folder, config, schema and package (documentation excluded)."""
    rels = [
        f"workflows/{slug}",
        f"config/{slug}.yaml",
        f"config/schemas/{slug}.schema.yaml",
        f"modules/paperflow/{slug}",
    ]
    return [p for rel in rels for p in _files_under(root, rel)]


def core_code_files(root: Path) -> list[Path]:
    """What every paper shares: the core library, the shared rules, the top Snakefile, global config and schemas."""
    rels = [
        "modules/paperflow/core",
        "modules/paperflow/__init__.py",
        "rules",
        "Snakefile",
        "config/config.yaml",
        "config/schemas/config.schema.yaml",
        "config/schemas/claims.schema.yaml",
    ]
    return [p for rel in rels if (root / rel).exists() for p in _files_under(root, rel)]


def files_hash(root: Path, files: Sequence[Path]) -> str:
    """sha256 over the sorted (path relative to root, file sha256) pairs."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n".encode())
    return digest.hexdigest()


def code_hashes(root: Path, slug: str) -> dict[str, str]:
    return {"paper": files_hash(root, paper_code_files(root, slug)), "core": files_hash(root, core_code_files(root))}


def paper_code_drift(root: Path, slug: str, jobs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each job whose recorded script or imported module of paper `slug` differs from (or is absent in) the
    checkout at `root`, as "rule <name>: <file> (recorded <sha12>, now <sha12>)". The record's code hash is
    the checkout's, so results made by other paper code must not be recorded under it."""
    own = f"paperflow/{slug}/"
    found: list[str] = []
    for job in jobs:
        code = job.get("code") or {}
        files = {f"modules/{rel}": sha for rel, sha in (code.get("modules") or {}).items() if rel.startswith(own)}
        script = code.get("script") or {}
        if str(script.get("path", "")).startswith(f"workflows/{slug}/"):
            files[script["path"]] = script.get("sha256")
        for rel, sha in sorted(files.items()):
            now = sha256_file(root / rel) if (root / rel).is_file() else "absent"
            if now != sha:
                found.append(f"rule {job.get('rule')}: {rel} (recorded {str(sha)[:12]}, now {now[:12]})")
                break
    return found


def paper_entry(metrics_path: Path, jobs: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The slug and the record entry of one paper, from its metrics.json and `jobs`, the job records beside it
    (`job_records(metrics_path.parent)`, read once by the caller)."""
    remedy = "rerun the paper's report rule that writes it"
    doc = read_json(metrics_path, remedy)
    try:
        return _paper_entry(metrics_path, doc, jobs)
    except UnreadableRecord as exc:
        raise RecordError(str(exc)) from None
    except SHAPE_ERRORS as exc:
        raise _shape_error(metrics_path, exc, remedy) from None


def _paper_entry(metrics_path: Path, doc: Any, jobs: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    slug = doc["paper"]
    if not isinstance(slug, str) or not re.fullmatch(r"[a-z0-9_]+", slug):
        raise RecordError(
            f"{metrics_path}: 'paper' is {json.dumps(slug)[:40]}, not a paper's slug; rerun its report rule"
        )
    claims = [_claim_entry(c, metrics_path) for c in doc["claims"]]
    ids = [c["id"] for c in claims]
    if len(set(ids)) != len(ids):
        raise RecordError(f"{metrics_path}: claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    code = read_record(metrics_path)["code"]
    paper_dir = metrics_path.parent
    times = [_job_time(r, paper_dir) for r in jobs]
    entry = {
        "metrics": str(metrics_path),
        "metrics_sha256": sha256_file(metrics_path),
        "git_commit": code["git_commit"],
        "git_dirty": code["git_dirty"],
        "job_commits": sorted({str(r["code"]["git_commit"]) for r in jobs}),
        "jobs": len(jobs),
        "jobs_wall_s": round(sum(t["wall_s"] for t in times), 3),
        "wall_clock_s": _wall_clock(jobs),
        "slowest_jobs": sorted(times, key=lambda t: -t["wall_s"])[:SLOWEST],
        "benchmarks": _benchmarks(paper_dir),
        "cpus": sorted({cpu_label(r.get("host", {}).get("cpu")) for r in jobs}),
        "claims": claims,
    }
    return slug, entry


def build_results_record(
    results: str | Path, scale: str, tolerance: Tolerance = Tolerance(), papers_only: Sequence[str] | None = None
) -> dict[str, Any]:
    """The record of `results/<scale>`, from its audited metrics.json files; raises RecordError when the
    tree's audit finds any problem. With `papers_only`, only those papers' folders are audited and recorded."""
    tree = Path(results) / scale
    trees = [tree] if papers_only is None else [tree / slug for slug in papers_only]
    for sub in trees:
        if not sub.is_dir():
            raise RecordError(f"no results folder {sub} to record")
        report = audit_tree(sub)
        if not report.ok:
            raise RecordError(
                f"the audit of {sub} found {len(report.problems)} problem(s) (listed above); fix them or rerun "
                "the jobs behind them, then try again",
                report.problems,
            )
    metrics = sorted(
        p for sub in trees for p in (sub.glob("*/metrics.json") if sub == tree else sub.glob("metrics.json"))
    )
    if not metrics:
        raise RecordError(f"no {tree}/*/metrics.json to record")
    from paperflow.core.config import repo_root

    papers: dict[str, dict[str, Any]] = {}
    for path in metrics:
        jobs = job_records(path.parent)
        slug, entry = paper_entry(path, jobs)
        drift = paper_code_drift(repo_root(), slug, jobs)
        if drift:
            raise RecordError(
                f"{path.parent}: {len(drift)} job(s) ran {slug}'s code as it is not in this checkout, e.g. "
                f"{drift[0]}; rerun them (snakemake reruns a job whose code changed) and record again"
            )
        entry["code_hashes"] = code_hashes(repo_root(), slug)
        if slug in papers:
            raise RecordError(f"{path}: paper {slug!r} is also {papers[slug]['metrics']}")
        papers[slug] = entry
    return {
        "schema": SCHEMA,
        "scale": scale,
        "tolerance": tolerance.to_json(),
        "git_commits": sorted({str(p["git_commit"]) for p in papers.values()}),
        "git_dirty": any(bool(p["git_dirty"]) for p in papers.values()),
        "papers": papers,
    }


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _job_label(job: Mapping[str, Any]) -> str:
    wildcards = ",".join(f"{k}={v}" for k, v in job["wildcards"].items())
    return f"{job['rule']}[{wildcards}]" if wildcards else job["rule"]


def _status_rows(record: Mapping[str, Any]) -> list[str]:
    rows = [
        "| paper | gated claims held | gated verdicts | central claim(s) | wall clock | jobs (Σ wall_s) "
        "| benchmarked jobs (Σ s) | slowest jobs (wall_s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for slug, paper in record["papers"].items():
        gated = [c for c in paper["claims"] if c["gated"]]
        held = sum(bool(c["held"]) for c in gated)
        slowest = "; ".join(f"`{_job_label(j)}` {j['wall_s']:.1f} s" for j in paper["slowest_jobs"])
        bench = paper["benchmarks"]
        wall = paper.get("wall_clock_s")
        rows.append(
            f"| [{slug}](#{slug}) | {held}/{len(gated)} | {_verdict_counts(gated)} | {_central(paper['claims'])} "
            f"| {'n/a' if wall is None else f'{wall:.0f} s'} | {paper['jobs']} ({paper['jobs_wall_s']:.1f} s) "
            f"| {bench['jobs']} ({bench['total_s']:.1f} s) | {slowest} |"
        )
    return rows


def _verdict_counts(claims: Sequence[Mapping[str, Any]]) -> str:
    if not claims or any("verdict" not in c for c in claims):  # a README test's hand-made record has none
        return "–"
    from paperflow.core.claims import counts_text

    return counts_text(claims)


def _central(claims: Sequence[Mapping[str, Any]]) -> str:
    central = [c for c in claims if c.get("central")]
    return "; ".join(f"`{c['id']}` {c['verdict']}" for c in central) or "–"


def _claim_rows(slug: str, claims: Sequence[Mapping[str, Any]]) -> list[str]:
    from paperflow.core import claims as claims_lib

    rows = [
        "| claim | statement | effect | per seed (effect) | estimate [CI] | claimed | verdict | control | gated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in sorted(claims, key=lambda c: not c["central"]):
        per_seed = ", ".join(f"{s}: {fmt(v)}" for s, v in zip(c["seeds"], c["effects"], strict=True))
        star = "★ " if c["central"] else ""
        rows.append(
            f'| <a id="{slug}-{c["id"]}"></a>{star}`{c["id"]}` | {_cell(c["statement"])} '
            f"| {_cell(claims_lib.effect_text(c))} ({c['metric']}) | {per_seed} | {claims_lib.interval_text(c)} "
            f"| {claims_lib.condition_text(c)} | {claims_lib.verdict_text(c)} | {_cell(claims_lib.control_text(c))} "
            f"| {'yes' if c['gated'] else 'no'} |"
        )
    return rows


def _restamp_lines(paper: Mapping[str, Any]) -> list[str]:
    """What `paperflow record restamp` carried the entry across, one line each."""
    stamps = paper["restamped"] if "restamped" in paper else []
    return [
        f"Restamped from `{s['from_commit'][:12]}` (paper hash `{s['paper_hash_was'][:12]}` -> `{s['paper_hash'][:12]}`): "
        f"its {s['jobs']} jobs are planned as at that commit, code hashes included, so the results stand without a rerun."
        for s in stamps
    ]


def render_markdown(record: Mapping[str, Any]) -> str:
    """The readable record: a status table, then one claims table per paper; every number from `record`."""
    scale = record["scale"]
    tol = Tolerance(record["tolerance"]["rtol"], record["tolerance"]["atol"])
    commits = ", ".join(f"`{c[:12]}`" for c in record["git_commits"])
    lines = [
        f"# Results on record — scale `{scale}`",
        "",
        f"Generated by `paperflow record write --scale {scale}` from the audited "
        f"`results/{scale}/*/metrics.json` and their provenance records; do not edit by hand. "
        f"`paperflow record check --scale {scale}` compares a fresh run with `{scale}.json`.",
        "",
        f"- commit(s): {commits}{' (dirty working tree)' if record['git_dirty'] else ''}",
        f"- tolerance of the check: {tol.describe()}",
        "- times: a job's `wall_s` is the time inside its script; benchmarks time whole job processes",
        "",
        "## Status",
        "",
        *_status_rows(record),
    ]
    for slug, paper in record["papers"].items():
        dirty = " (dirty)" if paper["git_dirty"] else ""
        lines += [
            "",
            f"## {slug}",
            "",
            f"From `{paper['metrics']}`, written at commit `{str(paper['git_commit'])[:12]}`{dirty}, "
            f"on {' and '.join(f'`{c}`' for c in paper.get('cpus', ['unknown']))}.",
            *_restamp_lines(paper),
            "",
            *_claim_rows(slug, paper["claims"]),
        ]
    return "\n".join(lines) + "\n"


def write_record(
    results: str | Path,
    scale: str,
    out: str | Path,
    tolerance: Tolerance = Tolerance(),
    papers_only: Sequence[str] | None = None,
) -> tuple[Path, Path]:
    """Write `<out>/<scale>.json` and `<out>/<scale>.md` from the audited `results/<scale>` tree. With
    `papers_only`, the existing record at `out` (if any) keeps every other paper and those papers' entries are
    replaced or added (one paper rerun, its record updated)."""
    record = build_results_record(results, scale, tolerance, papers_only)
    json_path, md_path = record_paths(out, scale)
    rewrite = f"write the whole record again with `paperflow record write --scale {scale}` (no --papers)"
    if papers_only is not None:
        old = read_json(json_path, rewrite) if json_path.is_file() else {"papers": {}}  # the first papers on record
        if not isinstance(old, dict) or not isinstance(old.get("papers"), dict):
            raise RecordError(f"{json_path}: has no 'papers' object; {rewrite}")
        merged = {**old["papers"], **record["papers"]}
        record = {
            **record,
            "papers": dict(sorted(merged.items())),
            "git_commits": sorted({str(p["git_commit"]) for p in merged.values()}),
            "git_dirty": any(bool(p["git_dirty"]) for p in merged.values()),
        }
    try:  # both are made before either is written: a metrics.json the record cannot hold changes neither file
        text = json.dumps(record, indent=2, allow_nan=False) + "\n"
        markdown = render_markdown(json.loads(text))
    except SHAPE_ERRORS as exc:
        raise _shape_error(
            f"the record of {Path(results) / scale}", exc, "rerun the report rules whose metrics.json hold it"
        ) from None
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(text)
    md_path.write_text(markdown)
    return json_path, md_path


@dataclass(frozen=True)
class Finding:
    """One difference between the record and a fresh run; `level` is FAIL or WARN."""

    level: str
    paper: str
    claim: str
    what: str
    recorded: Any
    fresh: Any
    note: str = ""


def _claims_by_key(record: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(slug, c["id"]): c for slug, paper in record["papers"].items() for c in paper["claims"]}


def _flip_level(fresh: Mapping[str, Any], tol: Tolerance) -> tuple[str, str]:
    value, threshold = fresh["value"], fresh["threshold"]
    if value is not None and threshold is not None and abs(value - threshold) <= tol.allowed(threshold):
        return "WARN", "flipped within the tolerance of the threshold"
    return "FAIL", "flipped"


def claim_findings(
    paper: str, recorded: Mapping[str, Any], fresh: Mapping[str, Any], tol: Tolerance, same_cpu: bool = True
) -> list[Finding]:
    """Every way the fresh claim differs from the recorded one beyond the tolerance; with `same_cpu`
    False a moved value is a warning (see the module's docstring)."""
    cid = recorded["id"]
    moved = ("FAIL", "moved") if same_cpu else ("WARN", "moved (another CPU)")
    found = [
        Finding("FAIL", paper, cid, key, recorded.get(key), fresh.get(key), "definition changed")
        for key in DEFINITION_KEYS
        if recorded.get(key) != fresh.get(key)
    ]
    found += [
        Finding(moved[0], paper, cid, key, recorded[key], fresh[key], moved[1])
        for key in NUMBER_KEYS
        if (key in recorded or key in fresh) and not tol.close(recorded.get(key), fresh.get(key))
    ]
    if len(recorded["values"]) != len(fresh["values"]):
        found.append(Finding("FAIL", paper, cid, "values", recorded["values"], fresh["values"], "seed count changed"))
    else:
        found += [
            Finding(moved[0], paper, cid, f"values[seed {seed}]", r, f, moved[1])
            for seed, r, f in zip(recorded["seeds"], recorded["values"], fresh["values"], strict=True)
            if not tol.close(r, f)
        ]
    judged = "verdict" in recorded and "verdict" in fresh
    if recorded["held"] != fresh["held"]:
        level, note = _verdict_level(recorded, fresh, tol, same_cpu) if judged else _flip_level(fresh, tol)
        found.append(Finding(level, paper, cid, "held", recorded["held"], fresh["held"], note))
    if recorded.get("verdict") != fresh.get("verdict"):
        level, note = _verdict_level(recorded, fresh, tol, same_cpu)
        found.append(Finding(level, paper, cid, "verdict", recorded.get("verdict"), fresh.get("verdict"), note))
    return found


# verdicts one step apart: an interval bound, or the control's, crossed a threshold
ADJACENT_VERDICTS = {
    frozenset(("held", "inconclusive")),
    frozenset(("refuted", "inconclusive")),
    frozenset(("held", "control also holds")),
    frozenset(("inconclusive", "control also holds")),
}


def _verdict_level(
    recorded: Mapping[str, Any], fresh: Mapping[str, Any], tol: Tolerance, same_cpu: bool = True
) -> tuple[str, str]:
    """A verdict that changed fails, unless an interval bound lies within the tolerance of the threshold (or of
    the band's edge), or, on another CPU, the verdict moved one step (held or refuted <-> inconclusive, or the
    control's verdict crossed): another CPU's rounding moves values by percents in the papers whose training
    amplifies last bits (the module's docstring), and must not block a landing; held <-> refuted still fails."""
    pair = frozenset((recorded.get("verdict"), fresh.get("verdict")))
    if not same_cpu and pair in ADJACENT_VERDICTS:
        return "WARN", "verdict moved one step on another CPU"
    threshold = fresh.get("threshold")
    edges = [threshold, -threshold] if fresh.get("comparison") == "within" and threshold is not None else [threshold]
    bounds = [fresh.get("ci_low"), fresh.get("ci_high"), fresh.get("value")]
    for edge in edges:
        for bound in bounds:
            if edge is not None and bound is not None and abs(bound - edge) <= tol.allowed(edge):
                return "WARN", "verdict changed with an interval bound within the tolerance of the threshold"
    return "FAIL", "verdict changed"


def compare_records(recorded: Mapping[str, Any], fresh: Mapping[str, Any], tol: Tolerance) -> list[Finding]:
    """Every finding of the check, claim by claim, papers and claims in sorted order."""
    old, new = _claims_by_key(recorded), _claims_by_key(fresh)
    found: list[Finding] = []
    same_cpu = {}
    for slug in sorted(recorded["papers"].keys() & fresh["papers"].keys()):
        was, now = (record["papers"][slug].get("cpus", ["unknown"]) for record in (recorded, fresh))
        same_cpu[slug] = was == now
        if not same_cpu[slug]:
            found.append(
                Finding("WARN", slug, "*", "cpus", "; ".join(was), "; ".join(now), "another CPU: moves are warnings")
            )
    for paper, cid in sorted(old.keys() | new.keys()):
        if (paper, cid) not in new:
            found.append(Finding("FAIL", paper, cid, "claim", "present", "absent", "disappeared"))
        elif (paper, cid) not in old:
            found.append(Finding("FAIL", paper, cid, "claim", "absent", "present", "appeared"))
        else:
            found += claim_findings(paper, old[paper, cid], new[paper, cid], tol, same_cpu[paper])
    return found


def read_committed(record_dir: str | Path, scale: str) -> dict[str, Any]:
    """The committed record of `scale`; raises RecordError when it is missing or its Markdown is not
    the rendering of its JSON (hand-edited, or not regenerated)."""
    json_path, md_path = record_paths(record_dir, scale)
    if not json_path.is_file() or not md_path.is_file():
        raise RecordError(
            f"no record {json_path} and {md_path}; write it with `paperflow record write --scale {scale}`"
        )
    rewrite = f"restore it from git or rewrite it with `paperflow record write --scale {scale}`"
    record = read_json(json_path, rewrite)
    try:
        rendered = render_markdown(record)
    except SHAPE_ERRORS as exc:
        raise _shape_error(json_path, exc, rewrite) from None
    try:
        committed_md = md_path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordError(f"{md_path}: cannot be read as UTF-8 text ({exc}); {rewrite}") from None
    if committed_md != rendered:
        raise RecordError(f"{md_path} is not the rendering of {json_path}; regenerate it with `paperflow record write`")
    return record


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "n/a" if value is None else str(value)


def _delta(finding: Finding, tol: Tolerance) -> tuple[str, str]:
    r, f = finding.recorded, finding.fresh
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (r, f))
    if numbers:
        return f"{abs(f - r):.3g}", f"{tol.allowed(r):.3g}"
    return "", ""


def findings_table(findings: Sequence[Finding], tol: Tolerance) -> str:
    """A plain-text table of what moved (level, paper, claim, field, recorded, fresh, |Δ|, allowed, note)."""
    header = ("level", "paper", "claim", "field", "recorded", "fresh", "|Δ|", "allowed", "note")
    rows = [header] + [
        (f.level, f.paper, f.claim, f.what, _show(f.recorded), _show(f.fresh), *_delta(f, tol), f.note)
        for f in findings
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def hash_findings(recorded: Mapping[str, Any], root: Path, papers: Sequence[str]) -> list[Finding]:
    """The record of a scale CI does not rerun, against the checkout: a paper whose own files (workflow, config,
    schema, package) changed since its record fails; a moved core warns, and so does a paper without a record yet
    (it names the command that records it): a stale record misleads a reader, a missing one says so."""
    scale = recorded["scale"]
    found = []
    for slug in papers:
        entry = recorded["papers"].get(slug)
        rerun = f"rerun `snakemake --cores 2 --config scale={scale} papers=[{slug}]`, then `paperflow record write --scale {scale} --papers {slug}`"
        if entry is None:
            found.append(Finding("WARN", slug, "*", "record", "absent", "workflow present", f"no record yet: {rerun}"))
            continue
        now = code_hashes(root, slug)
        was = entry.get("code_hashes", {})
        if was.get("paper") != now["paper"]:
            found.append(
                Finding(
                    "FAIL", slug, "*", "paper code", str(was.get("paper"))[:12], now["paper"][:12], f"stale: {rerun}"
                )
            )
        if was.get("core") != now["core"]:
            found.append(
                Finding(
                    "WARN",
                    slug,
                    "*",
                    "core code",
                    str(was.get("core"))[:12],
                    now["core"][:12],
                    "the core moved since the record",
                )
            )
    return found


def check_record(
    results: str | Path, scale: str, record_dir: str | Path, tolerance: Tolerance = Tolerance()
) -> list[Finding]:
    """Compare the audited fresh tree `results/<scale>` with the committed record of `scale`. For a scale CI does
    not rerun (`cpu`), the record is also checked against the code's hashes, and a missing results tree checks the
    hashes only."""
    from paperflow.core.config import available_papers, repo_root

    recorded = read_committed(record_dir, scale)
    found: list[Finding] = []
    json_path = record_paths(record_dir, scale)[0]
    rewrite = f"restore it from git or rewrite it with `paperflow record write --scale {scale}`"
    if scale in HASH_CHECKED_SCALES:
        try:
            found += hash_findings(recorded, repo_root(), available_papers())
        except SHAPE_ERRORS as exc:
            raise _shape_error(json_path, exc, rewrite) from None
        if not (Path(results) / scale).is_dir():
            return found
    fresh = build_results_record(results, scale, tolerance)
    try:
        return found + compare_records(recorded, fresh, tolerance)
    except SHAPE_ERRORS as exc:
        raise _shape_error(json_path, exc, rewrite) from None


README_BEGIN = "<!-- status: generated by `paperflow record readme` from docs/results; do not edit -->"
README_END = "<!-- status: end -->"


def paper_titles(root: str | Path) -> dict[str, str]:
    """Each paper's name as its config's `description` gives it (up to the first colon), by slug."""
    import yaml

    titles = {}
    for cfg in sorted(Path(root, "config").glob("*.yaml")):
        doc = yaml.safe_load(cfg.read_text()) or {}
        if isinstance(doc, dict) and "description" in doc:
            titles[cfg.stem] = " ".join(str(doc["description"]).split(":")[0].split())
    return titles


README_SCALES = ("smoke", "cpu", "paper")


def readme_status(records: Mapping[str, Mapping[str, Any]], papers: Sequence[str], titles: Mapping[str, str]) -> str:
    """The README's status table: for every paper with a workflow, at smoke and paper scale, how many
    gated claims held (linked to its rows in docs/results/<scale>.md), or "not run" where the scale has
    no record of the paper."""
    scales = list(README_SCALES)
    head = "| paper | slug | " + " | ".join(f"`{s}`: gated claims held" for s in scales) + " | central claim (cpu) |"
    rows = [head, "|---|---|" + "---|" * (len(scales) + 1)]
    for slug in papers:
        cells = []
        for scale in scales:
            entry = records[scale]["papers"].get(slug) if scale in records else None
            if entry is None:
                cells.append("not run")
                continue
            gated = [c for c in entry["claims"] if c["gated"]]
            held = sum(bool(c["held"]) for c in gated)
            counts = _verdict_counts(gated)
            detail = "" if counts == "–" else f": {counts}"
            cells.append(f"[{held} of {len(gated)}](docs/results/{scale}.md#{slug}){detail}")
        cpu = records.get("cpu", {}).get("papers", {}).get(slug)
        cells.append(_central(cpu["claims"]) if cpu else "not run")
        title = titles.get(slug, slug)
        rows.append(f"| {_cell(title)} | [`{slug}`](workflows/{slug}/README.md) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


README_TIMES_BEGIN = "<!-- times: generated by `paperflow record readme` from docs/results; do not edit -->"
README_TIMES_END = "<!-- times: end -->"
TIME_SCALES = ("tiny", "smoke", "cpu")


def _duration(seconds: float) -> str:
    """12 s, 7.5 min, 2.1 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _time_cell(entries: Sequence[Mapping[str, Any]]) -> str:
    walls = [e.get("wall_clock_s") for e in entries]
    wall = "wall n/a" if None in walls else _duration(sum(walls))
    cpus = [e.get("benchmarks", {}).get("cpu_s") for e in entries]
    cpu = "" if None in cpus else f"; ≥ {_duration(sum(cpus))} of CPU"
    return f"{wall} ({_duration(sum(e['jobs_wall_s'] for e in entries))} of jobs{cpu})"


def readme_times(records: Mapping[str, Mapping[str, Any]], papers: Sequence[str]) -> str:
    """The README's table of measured times: for every paper with a workflow and every scale a laptop runs, the
    record's wall clock (seconds with at least one of the paper's jobs running), its jobs' summed wall time and the
    CPU time its benchmarked jobs used (a lower bound; omitted where a record predates it), or "no record"; the last
    row sums the papers that the scale's record holds."""
    head = "| paper | " + " | ".join(f"`{s}`: wall (jobs' time; CPU)" for s in TIME_SCALES) + " |"
    rows = [head, "|---|" + "---|" * len(TIME_SCALES)]
    for slug in papers:
        cells = []
        for scale in TIME_SCALES:
            entry = records.get(scale, {}).get("papers", {}).get(slug)
            cells.append("no record" if entry is None else _time_cell([entry]))
        rows.append(f"| [`{slug}`](workflows/{slug}/README.md) | " + " | ".join(cells) + " |")
    totals = []
    for scale in TIME_SCALES:
        entries = [e for slug, e in records.get(scale, {}).get("papers", {}).items() if slug in papers]
        totals.append(f"{len(entries)} papers: {_time_cell(entries)}" if entries else "no record")
    rows.append("| all papers on record | " + " | ".join(totals) + " |")
    return "\n".join(rows)


def _rewrite_block(text: str, begin: str, end: str, body: str, path: Path) -> str:
    if text.count(begin) != 1 or text.count(end) != 1:
        raise RecordError(f"{path} needs exactly one generated block between {begin!r} and {end!r}")
    start = text.index(begin) + len(begin)
    return text[:start] + "\n" + body + "\n" + text[text.index(end) :]


def refresh_readme(readme: str | Path, record_dir: str | Path, papers: Sequence[str], root: str | Path) -> bool:
    """Rewrite the status block and the times block of `readme` from the records `<record_dir>/<scale>.json` that
    exist; returns whether the file changed."""
    scales = dict.fromkeys([*README_SCALES, *TIME_SCALES])
    records = {s: json.loads(p.read_text()) for s in scales if (p := Path(record_dir, f"{s}.json")).is_file()}
    if not records:
        raise RecordError(f"no record in {record_dir} to build the README status from")
    path = Path(readme)
    text = path.read_text()
    new = _rewrite_block(text, README_BEGIN, README_END, readme_status(records, papers, paper_titles(root)), path)
    new = _rewrite_block(new, README_TIMES_BEGIN, README_TIMES_END, readme_times(records, papers), path)
    if new != text:
        path.write_text(new)
    return new != text


def _own_jobs(jobs: Sequence[Mapping[str, Any]], slug: str) -> list[Mapping[str, Any]]:
    """The jobs of paper `slug` in a plan (the shared `all` and `summary` jobs left out: they depend on which
    papers a run composes and which results a checkout holds)."""
    return [job for job in jobs if str(job["rule"]).startswith(f"{slug}_")]


def restamp_record(
    record_dir: str | Path,
    scale: str,
    papers: Sequence[str],
    since: str,
    root: str | Path | None = None,
    plan: Any = None,
) -> list[str]:
    """Carry the record of `papers` at `scale` across a change that moves no job of theirs: for each paper, the
    record's paper hash must equal the paper hash of commit `since` (the record vouched for that code), and the
    paper's planned jobs at `scale` now must equal those at `since`, code hashes included (each job's script and
    every module it imports byte-identical, and its rule, wildcards, files, params, env and resources). Then its
    code hashes become the checkout's, and the entry lists the restamp. Any other change needs a rerun. Returns one
    line per paper restamped."""
    import subprocess
    import tempfile

    from paperflow.core.config import repo_root
    from paperflow.core.jobtable import first_difference, plan_of

    plan = plan or plan_of
    root = Path(root or repo_root())
    json_path = record_paths(record_dir, scale)[0]
    record = read_committed(record_dir, scale)
    rerun = "rerun it: `snakemake --cores 2 --config scale={scale} papers=[{slug}]`, then `paperflow record write`"

    def git(*args: str) -> str:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        if proc.returncode:
            raise RecordError(f"git {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()[:200]}")
        return proc.stdout.strip()

    commit = git("rev-parse", "--verify", f"{since}^{{commit}}")
    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="paperflow-restamp-") as tmp:
        then = Path(tmp) / "then"
        git("worktree", "add", "--detach", "--quiet", str(then), commit)
        try:
            for slug in papers:
                entry = record["papers"].get(slug)
                if entry is None:
                    raise RecordError(f"{json_path}: no entry for {slug}; nothing to restamp")
                was = entry["code_hashes"]["paper"]
                if code_hashes(then, slug)["paper"] != was:
                    raise RecordError(
                        f"{slug}: the record's paper hash {was[:12]} is not that of {since} ({commit[:12]}): give the "
                        f"commit whose code the record vouches for, or {rerun.format(scale=scale, slug=slug)}"
                    )
                old = _own_jobs(plan(then, scale, [slug]), slug)
                new = _own_jobs(plan(root, scale, [slug]), slug)
                difference = first_difference(old, new)
                if difference is not None:
                    raise RecordError(
                        f"{slug}: its {scale} plan moved since {commit[:12]} ({difference[:300]}); "
                        f"{rerun.format(scale=scale, slug=slug)}"
                    )
                now = code_hashes(root, slug)
                entry["restamped"] = [
                    *(entry["restamped"] if "restamped" in entry else []),
                    {"from_commit": commit, "jobs": len(new), "paper_hash_was": was, "paper_hash": now["paper"]},
                ]
                entry["code_hashes"] = now
                done.append(f"{slug}: {len(new)} {scale} jobs planned as at {commit[:12]}, code hashes included")
        finally:
            git("worktree", "remove", "--force", str(then))
    json_path.write_text(json.dumps(record, indent=2, allow_nan=False) + "\n")
    record_paths(record_dir, scale)[1].write_text(render_markdown(record))
    return done
