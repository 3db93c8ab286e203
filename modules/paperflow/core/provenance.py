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
) -> dict[str, Any]:
    """The record of one finished job. Inputs outside `generated_roots` are marked as sources."""
    roots = [str(Path(r)) for r in generated_roots]
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
        "outputs": [file_entry(p) for p in outputs],
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


def read_record(path: str | Path) -> dict[str, Any]:
    rec = record_path(path)
    if not rec.is_file():
        raise FileNotFoundError(f"no provenance record for {path} (expected {rec})")
    return json.loads(rec.read_text())


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

    def _check_hash(self, base: Path, path: str, recorded: str, what: str) -> None:
        actual = self._sha(base / path)
        if actual is None:
            self.report.problems.append(f"MISSING {path}: {what} but the file is gone")
        elif actual != recorded:
            self.report.problems.append(
                f"MISMATCH {path}: sha256 on disk {actual[:12]}... != {recorded[:12]}... {what}"
            )

    def start(self, target: Path) -> None:
        """Audit `target`: its job (every output it recorded) and every job upstream of it."""
        target_abs = target.resolve()
        try:
            first = read_record(target_abs)
        except (FileNotFoundError, json.JSONDecodeError) as exc:
            self.report.problems.append(f"NO RECORD {target}: {exc}")
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
            except json.JSONDecodeError as exc:
                self.report.problems.append(f"BROKEN RECORD {record_path(path)}: {exc}")
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
        record = json.loads(rec.read_text())
        jobs.setdefault(_job_key(record), record)
    return list(jobs.values())


def lineage(target: str | Path) -> list[str]:
    """Human-readable tree of the jobs behind `target`, one line per file."""
    lines: list[str] = []

    def walk(path: str, depth: int, seen: set[str]) -> None:
        pad = "  " * depth
        try:
            record = read_record(path)
        except FileNotFoundError:
            lines.append(f"{pad}{path}  [no record]")
            return
        sha = next((o["sha256"] for o in record["outputs"] if o["path"] == path), "?")
        wc = ",".join(f"{k}={v}" for k, v in record["wildcards"].items())
        lines.append(
            f"{pad}{path}  sha256:{sha[:12]}  rule {record['rule']}{'[' + wc + ']' if wc else ''}"
            f"  commit {str(record['code'].get('git_commit'))[:10]}  {record['ended']}"
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
