"""Provenance records: for every output file, where it came from.

Each job writes one record (JSON) and stores it beside each of its outputs as `<output>.prov.json`.
A record names the rule, wildcards, params, every input and output with its sha256, the code
(git commit and dirty flag, the hash of the library modules the stage imports, the script), the
environment (Python, key packages, the conda env file and its hash), the host, the SLURM job, the
seeds, start and end times and the tracking run ids. `audit` checks a file's job (every output it
recorded) and walks the records back to the downloads, checking each hash against the file on disk;
given a directory it audits the whole tree and names every data file that has no record.
"""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from paperflow.core.codehash import file_hashes
from paperflow.core.download import sha256_file

SCHEMA = "paperflow.provenance/1"
SUFFIX = ".prov.json"
KEY_PACKAGES = (
    "paperflow",
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "torch",
    "pytorch-lightning",
    "wandb",
    "snakemake",
    "anndata",
    "scanpy",
    "transformers",
    "cvxpy",
)
SLURM_VARS = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_CPUS_PER_TASK",
    "SLURM_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_CLUSTER_NAME",
)
UNRECORDED_DIRS = ("logs", "benchmarks")  # folders of a results tree that no job records (see audit_tree)


def record_path(path: str | Path) -> Path:
    return Path(str(path) + SUFFIX)


def file_entry(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    return {"path": str(path), "sha256": sha256_file(p), "bytes": p.stat().st_size}


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_state(script: str | None) -> dict[str, Any]:
    status = _git("status", "--porcelain", "--untracked-files=no")
    state: dict[str, Any] = {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "modules": {},
    }
    if script and Path(script).is_file():
        state["script"] = {"path": script, "sha256": sha256_file(script)}
        state["modules"] = file_hashes(script)
    return state


def environment_state(conda_env: str | None) -> dict[str, Any]:
    packages = {}
    for name in KEY_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable, "packages": packages}
    if conda_env:
        env["conda_env"] = {"path": conda_env, "sha256": sha256_file(conda_env) if Path(conda_env).is_file() else None}
    return env


# the x86 extensions that numeric libraries dispatch on (torch's ATen and oneDNN, MKL, OpenBLAS, numpy):
# two CPUs that differ here can round the same seeded computation differently
SIMD_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
)


def cpu_state(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU that ran the job, as far as it decides which numeric kernels run: vendor, model name and
    the SIMD extensions of SIMD_FLAGS it has (from the first processor of /proc/cpuinfo; elsewhere the
    platform's processor name and no flags)."""
    fields: dict[str, str] = {}
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    for line in text.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {
        "vendor": fields.get("vendor_id", platform.machine()),
        "model": fields.get("model name", platform.processor() or "unknown"),
        "simd": [f for f in SIMD_FLAGS if f in flags],
    }


def cpu_label(cpu: Mapping[str, Any] | None) -> str:
    """One line naming a CPU of `cpu_state` ("unknown" for a record written before CPUs were recorded)."""
    if not cpu:
        return "unknown"
    return f"{cpu['vendor']} {cpu['model']} [{' '.join(cpu['simd'])}]"


def host_state() -> dict[str, Any]:
    host: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu": cpu_state(),
    }
    torch = sys.modules.get("torch")  # only describe GPUs when the job itself used torch
    if torch is not None and torch.cuda.is_available():
        host["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return host


def slurm_state() -> dict[str, str] | None:
    state = {k: os.environ[k] for k in SLURM_VARS if k in os.environ}
    return state or None


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def build_record(
    *,
    rule: str,
    wildcards: Mapping[str, Any],
    params: Mapping[str, Any],
    inputs: Iterable[str],
    outputs: Iterable[str],
    generated_roots: Iterable[str],
    started: str,
    script: str | None = None,
    conda_env: str | None = None,
    seeds: Iterable[int] = (),
    extra: Mapping[str, Any] | None = None,
    temporary: Iterable[str] = (),
) -> dict[str, Any]:
    """The record of one finished job. Inputs outside `generated_roots` are marked as sources; outputs in
    `temporary` (the rule's `temp()` files, which Snakemake deletes once their consumers ran) are marked so, and the
    audit then accepts them gone, their hash still checked against every consumer's record."""
    roots = [str(Path(r)) for r in generated_roots]
    temporary = {str(p) for p in temporary}
    out_entries = [file_entry(p) | ({"temporary": True} if str(p) in temporary else {}) for p in outputs]
    in_entries = []
    for path in inputs:
        entry = file_entry(path)
        entry["source"] = not any(Path(path).is_relative_to(r) for r in roots)
        in_entries.append(entry)
    return {
        "schema": SCHEMA,
        "rule": rule,
        "wildcards": _jsonable(wildcards),
        "params": _jsonable(params),
        "inputs": in_entries,
        "outputs": out_entries,
        "code": code_state(script),
        "environment": environment_state(conda_env),
        "host": host_state(),
        "slurm": slurm_state(),
        "seeds": list(seeds),
        "started": started,
        "ended": utc_now(),
        **_jsonable(extra or {}),
    }


def write_record(record: Mapping[str, Any]) -> list[Path]:
    """Store the record beside every output it describes."""
    text = json.dumps(record, indent=2, sort_keys=True)
    paths = [record_path(o["path"]) for o in record["outputs"]]
    for path in paths:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return paths


class UnreadableRecord(ValueError):
    """A provenance record that is there but cannot be used: not UTF-8, not JSON (say truncated), or not the
    shape `build_record` writes (no `rule`, `outputs` or `inputs`, a file entry without a path or sha256)."""


REMEDY = "rerun the job that writes it (or delete the record and its outputs so Snakemake does)"


def read_json_file(
    path: str | Path, remedy: str, error: type[Exception] = ValueError, *, missing_raises: bool = False
) -> Any:
    """The JSON document in the file `path`. Every way it can be unusable raises `error` with one line: the
    file, the problem and `remedy` (not UTF-8, empty, not JSON, with "(truncated?)" where the text stops
    inside a value, nested too deeply, a directory, unreadable). A missing file raises `error` too, unless
    `missing_raises`, when FileNotFoundError passes through for the caller to word."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); {remedy}") from None
    except IsADirectoryError:
        raise error(f"{path}: a directory, not a file; remove it") from None
    except FileNotFoundError:
        if missing_raises:
            raise
        raise error(f"{path}: missing; {remedy}") from None
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror or exc}); check its permissions") from None
    if not text.strip():
        raise error(f"{path}: empty; {remedy}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON{_truncation_hint(text, exc)}: {exc}; {remedy}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to read; {remedy}") from None


def _truncation_hint(text: str, exc: json.JSONDecodeError) -> str:
    """ " (truncated?)" where the text stops inside a JSON value: the parser failed at the end of the text, a
    string opened before the end never closed (the parser then points at the opening quote), or what is left
    from where it failed is the start of a literal or the tail of a number (`nu`, `tr`, `2.`, `1e-`)."""
    rest = text[exc.pos :].rstrip()
    open_string = exc.msg.startswith("Unterminated string")
    return " (truncated?)" if not rest or open_string or _CUT_TOKEN.fullmatch(rest) else ""


_CUT_TOKEN = re.compile(r"n(u(l)?)?|t(r(u)?)?|f(a(l(s)?)?)?|[-+.eE0-9]+")


def _check_entries(rec: Path, record: Mapping[str, Any], key: str) -> None:
    entries = record.get(key)
    if not isinstance(entries, list):
        have = "lacks" if key not in record else f"has a {type(entries).__name__} for"
        raise UnreadableRecord(f"{rec}: {have} {key!r}, not a list of files; {REMEDY}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise UnreadableRecord(f"{rec}: {key}[{i}] is a {type(entry).__name__}, not a file entry; {REMEDY}")
        for field_, ok in (("path", _plain_text), ("sha256", _SHA256.fullmatch)):
            value = entry.get(field_)
            if not isinstance(value, str) or not ok(value):
                raise UnreadableRecord(
                    f"{rec}: {key}[{i}].{field_} is {json.dumps(value)[:40]}, not a {field_}; {REMEDY}"
                )


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _plain_text(value: str) -> bool:
    """Non-empty, without control characters (no path or rule this project writes has one; a newline in a
    problem's line would break the one-line form of the CLI's messages)."""
    return bool(value) and not any(ord(c) < 32 or ord(c) == 127 for c in value)


def check_record_shape(rec: Path, record: Any) -> dict[str, Any]:
    """`record` (parsed from `rec`) if it has what `audit`, `lineage` and the results record read; raises
    UnreadableRecord naming the first thing missing."""
    if not isinstance(record, dict):
        raise UnreadableRecord(f"{rec}: a JSON {type(record).__name__}, not a provenance record (an object); {REMEDY}")
    if not isinstance(record.get("rule"), str) or not _plain_text(record["rule"]):
        raise UnreadableRecord(f"{rec}: {'lacks' if 'rule' not in record else 'has no rule name in'} 'rule'; {REMEDY}")
    for key in ("outputs", "inputs"):
        _check_entries(rec, record, key)
    for key in ("wildcards", "params", "code"):
        if key in record and not isinstance(record[key], dict):
            raise UnreadableRecord(f"{rec}: {key!r} is a {type(record[key]).__name__}, not an object; {REMEDY}")
    return record


def load_record_file(rec: str | Path) -> dict[str, Any]:
    """The provenance record stored in the file `rec` (a `.prov.json`); raises UnreadableRecord when it is
    not UTF-8, not JSON or not a record, FileNotFoundError when it is absent."""
    rec = Path(rec)
    record = read_json_file(rec, REMEDY, UnreadableRecord, missing_raises=True)
    return check_record_shape(rec, record)


def read_record(path: str | Path) -> dict[str, Any]:
    """The record of the file `path`. Raises FileNotFoundError when `path` has no record beside it and
    UnreadableRecord when the record is there but unusable (see `load_record_file`)."""
    rec = record_path(path)
    if not rec.exists():
        raise FileNotFoundError(f"no provenance record for {path} (expected {rec})")
    return load_record_file(rec)


@dataclass
class AuditReport:
    """What `audit` checked, and every problem it found."""

    target: str
    checked: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rules: dict[str, str] = field(default_factory=dict)
    jobs: int = 0  # distinct jobs whose outputs and inputs were checked
    hashed: int = 0  # distinct files hashed
    deleted: list[str] = field(default_factory=list)  # temporary outputs gone as Snakemake deletes them (checked)

    @property
    def ok(self) -> bool:
        return not self.problems


def _base_dir(target: Path, record: Mapping[str, Any]) -> tuple[Path, str] | None:
    """The directory the job ran in (recorded paths are relative to it: Snakemake's working dir) and
    the target's path as recorded."""
    for out in record["outputs"]:
        recorded = Path(out["path"])
        if recorded.is_absolute():
            if recorded == target:
                return Path("/"), out["path"]
        elif target.parts[-len(recorded.parts) :] == recorded.parts:
            return Path(*target.parts[: -len(recorded.parts)]), out["path"]
    return None


def _job_key(record: Mapping[str, Any]) -> str:
    """One job's identity: the same record is stored beside each of its outputs."""
    return json.dumps(record, sort_keys=True)


class _Auditor:
    """Walks records into one `AuditReport`, hashing each file and checking each job only once."""

    def __init__(self, report: AuditReport) -> None:
        self.report = report
        self._hashes: dict[Path, str | None] = {}
        self._jobs: set[str] = set()
        self._walked: set[Path] = set()

    def _sha(self, path: Path) -> str | None:
        if path not in self._hashes:
            self._hashes[path] = sha256_file(path) if path.is_file() else None
            self.report.hashed += self._hashes[path] is not None
        return self._hashes[path]

    def _temporary_sha(self, base: Path, path: str) -> str | None:
        """The sha256 its producer recorded for `path` if that job marked it temporary (a `temp()` output), else
        None."""
        try:
            producer = read_record(base / path)
        except (FileNotFoundError, UnreadableRecord):
            return None
        entry = next((o for o in producer["outputs"] if o["path"] == path), None)
        return entry["sha256"] if entry is not None and entry.get("temporary") else None

    def _check_hash(self, base: Path, path: str, recorded: str, what: str) -> None:
        actual = self._sha(base / path)
        if actual is None and (produced := self._temporary_sha(base, path)) is not None:
            if produced != recorded:  # gone, as temp() files go: the records must still agree on its bytes
                self.report.problems.append(
                    f"MISMATCH {path}: a deleted temporary file, recorded by its producer as {produced[:12]}... "
                    f"but as {recorded[:12]}... {what}"
                )
            elif path not in self.report.deleted:
                self.report.deleted.append(path)
        elif actual is None:
            self.report.problems.append(f"MISSING {path}: {what} but the file is gone")
        elif actual != recorded:
            self.report.problems.append(
                f"MISMATCH {path}: sha256 on disk {actual[:12]}... != {recorded[:12]}... {what}"
            )

    def start(self, target: Path) -> None:
        """Audit `target`: its job (every output it recorded) and every job upstream of it."""
        target_abs = target.resolve()
        if not target_abs.exists() and not record_path(target_abs).exists():
            self.report.problems.append(
                f"NO SUCH FILE {target}: nothing at this path nor a record of it; check the path"
            )
            return
        try:
            first = read_record(target_abs)
        except FileNotFoundError:
            self.report.problems.append(
                f"NO RECORD {target}: no provenance record {record_path(target)} beside it; a file no job of the "
                "workflow wrote, or whose record was deleted: rerun the job that writes it"
            )
            return
        except UnreadableRecord as exc:
            self.report.problems.append(f"UNREADABLE RECORD {exc}")
            return
        located = _base_dir(target_abs, first)
        if located is None:
            self.report.problems.append(f"BROKEN RECORD {record_path(target)}: it does not list {target} as an output")
            return
        self._walk(*located)

    def _walk(self, base: Path, start: str) -> None:
        queue: deque[str] = deque([start])
        while queue:
            path = queue.popleft()
            if base / path in self._walked:
                continue
            self._walked.add(base / path)
            try:
                record = read_record(base / path)
            except FileNotFoundError as exc:
                self.report.problems.append(f"NO RECORD {path}: {exc}")
                continue
            except UnreadableRecord as exc:
                self.report.problems.append(f"UNREADABLE RECORD {exc}")
                continue
            self.report.checked.append(path)
            self.report.rules[path] = record["rule"]
            if not any(o["path"] == path for o in record["outputs"]):
                self.report.problems.append(f"BROKEN RECORD {record_path(path)}: it does not list {path} as an output")
            queue.extend(self._job(base, path, record))

    def _job(self, base: Path, path: str, record: Mapping[str, Any]) -> list[str]:
        """Check every output and input hash of the job behind `path` (once per job); return the
        generated inputs still to walk."""
        key = _job_key(record)
        if key in self._jobs:
            return []
        self._jobs.add(key)
        self.report.jobs += 1
        rule = record["rule"]
        for out in record["outputs"]:
            self._check_hash(base, out["path"], out["sha256"], f"(recorded as output of rule {rule})")
        upstream = []
        for inp in record["inputs"]:
            self._check_hash(base, inp["path"], inp["sha256"], f"(recorded as input of rule {rule} for {path})")
            if not inp.get("source"):
                upstream.append(inp["path"])
            elif inp["path"] not in self.report.sources:
                self.report.sources.append(inp["path"])
        return upstream


def audit(target: str | Path) -> AuditReport:
    """Verify `target` against the provenance records, every hash against the file on disk.

    For a file: its job's record, i.e. every output that job wrote (a report's metrics.json, tables
    and figures as well as the report), then every job upstream of it back to the sources. For a
    directory: `audit_tree`. Recorded paths are relative to the directory the workflow ran in; that
    directory is found from the target's own record, so `audit` works from any current directory."""
    if Path(target).is_dir():
        return audit_tree(target)
    report = AuditReport(target=str(target))
    _Auditor(report).start(Path(target))
    return report


def _unrecorded_by_design(name: str) -> bool:
    """Whether a folder or file of this name in a results tree legitimately has no record."""
    return name in UNRECORDED_DIRS or name.startswith(".snakemake")


def tree_files(root: str | Path) -> tuple[list[Path], list[Path]]:
    """The provenance records and the data files under `root`, sorted, leaving out what has no record
    by design (see `audit_tree`)."""
    records: list[Path] = []
    data: list[Path] = []
    top = Path(root)
    for folder, dirnames, filenames in os.walk(top):
        here = Path(folder)
        dirnames[:] = sorted(d for d in dirnames if not _unrecorded_by_design(d))
        for name in filenames:
            if _unrecorded_by_design(name):
                continue
            (records if name.endswith(SUFFIX) else data).append(here / name)
    return sorted(records), sorted(data)


def audit_tree(root: str | Path) -> AuditReport:
    """Audit a whole results tree (e.g. `results/smoke`): every record under it as `audit` does for a
    file, and every data file under it must have a record.

    Left out, because nothing records them by design: the `.prov.json` records themselves (each is
    checked as a record), any `logs/` folder (job logs, and the CSV and wandb run folders that live in
    it), any `benchmarks/` folder (Snakemake's `benchmark:` TSVs) and Snakemake's own `.snakemake*`
    metadata. Anything else without a record is a problem, as is a tree without any record."""
    report = AuditReport(target=str(root))
    if not Path(root).is_dir():
        report.problems.append(f"MISSING {root}: not a directory")
        return report
    records, data = tree_files(root)
    if not records:
        report.problems.append(f"NO RECORD {root}: no provenance record anywhere under it")
    for path in data:
        if not record_path(path).is_file():
            report.problems.append(f"NO RECORD {path}: a file under {root} that no job recorded")
    auditor = _Auditor(report)
    for rec in records:
        auditor.start(rec.with_name(rec.name.removesuffix(SUFFIX)))
    return report


def job_records(root: str | Path) -> list[dict[str, Any]]:
    """Each job recorded under `root` once (a job's record stands beside each of its outputs)."""
    jobs: dict[str, dict[str, Any]] = {}
    for rec in tree_files(root)[0]:
        record = load_record_file(rec)
        jobs.setdefault(_job_key(record), record)
    return list(jobs.values())


def lineage(target: str | Path, problems: list[str] | None = None) -> list[str]:
    """Human-readable tree of the jobs behind `target`, one line per file. A file without a record is marked
    `[no record]`, one whose record is unreadable `[unreadable record]`, and that record's problem is appended to
    `problems` when given."""
    lines: list[str] = []

    def walk(path: str, depth: int, seen: set[str]) -> None:
        pad = "  " * depth
        try:
            record = read_record(path)
        except FileNotFoundError:
            lines.append(f"{pad}{path}  [no record]")
            return
        except UnreadableRecord as exc:
            lines.append(f"{pad}{path}  [unreadable record]")
            if problems is not None:
                problems.append(str(exc))
            return
        sha = next((o["sha256"] for o in record["outputs"] if o["path"] == path), "?")
        wc = ",".join(f"{k}={v}" for k, v in (record.get("wildcards") or {}).items())
        lines.append(
            f"{pad}{path}  sha256:{sha[:12]}  rule {record['rule']}{'[' + wc + ']' if wc else ''}"
            f"  commit {str((record.get('code') or {}).get('git_commit'))[:10]}  {record.get('ended', '?')}"
        )
        if path in seen:
            return
        seen.add(path)
        for inp in record["inputs"]:
            if inp.get("source"):
                lines.append(f"{pad}  {inp['path']}  sha256:{inp['sha256'][:12]}  [source]")
            else:
                walk(inp["path"], depth + 1, seen)

    walk(str(target), 0, set())
    return lines
