"""`paperflow plan`: what a run would ask of a cluster, from the DAG Snakemake would run (its dry run) and the
papers' configs: per paper the jobs per rule, the GPU jobs (and how many GPUs each asks for: the node shapes a
cluster needs) and GPU-hours requested, CPU-hours, the largest memory
request, and the downloads still without a checksum (neither in the config nor in the paper's lock file), each with
the reason no published checksum was found (`config/unpinned.yaml`)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paperflow.core.config import load_paper_config
from paperflow.core.download import read_lock, read_lock_revisions

_RULE = re.compile(r"^rule (\S+):\s*$")
_RES = re.compile(r"^\s+resources: (.*)$")
_THREADS = re.compile(r"^\s+threads: (\d+)\s*$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")


@dataclass
class PlannedJob:
    rule: str
    threads: int = 1
    resources: dict[str, str] = field(default_factory=dict)
    wildcards: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return int(self.resources.get("gpu", 0) or 0)

    @property
    def hours(self) -> float:
        return float(self.resources.get("runtime", 0) or 0) / 60.0

    @property
    def mem_gb(self) -> float:
        return float(self.resources.get("mem_mb", 0) or 0) / 1000.0


def parse_dry_run(text: str) -> list[PlannedJob]:
    """The jobs of a Snakemake dry run's output, with their threads and resources."""
    jobs: list[PlannedJob] = []
    for line in text.splitlines():
        if m := _RULE.match(line):
            jobs.append(PlannedJob(m.group(1)))
        elif jobs and (m := _THREADS.match(line)):
            jobs[-1].threads = int(m.group(1))
        elif jobs and (m := _WILDCARDS.match(line)):
            jobs[-1].wildcards = dict(kv.split("=", 1) for kv in m.group(1).split(", ") if "=" in kv)
        elif jobs and (m := _RES.match(line)):
            jobs[-1].resources = dict(kv.split("=", 1) for kv in m.group(1).split(", ") if "=" in kv)
    return jobs


def dry_run(root: str | Path, scale: str, papers: Sequence[str]) -> str:
    # --forceall: every job of the DAG, whatever this checkout already holds under results/ (a plan, not a resume)
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-n",
        "--forceall",
        "--config",
        f"scale={scale}",
        f"papers=[{','.join(papers)}]",
    ]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode:
        raise PlanError(
            f"Snakemake's dry run at scale {scale} failed (exit {proc.returncode}): "
            f"{last_message(proc.stderr or proc.stdout)}; run `snakemake {' '.join(cmd[3:])}` to see its whole output"
        )
    return proc.stdout


class PlanError(RuntimeError):
    """The dry run behind a plan failed; the message is one line."""


def last_message(text: str) -> str:
    """The last line of Snakemake's error output that says something (not a traceback's `File ...` line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("File ")]
    return lines[-1] if lines else "no output"


def unpinned_downloads(
    cfg: Any, lock: Mapping[str, Any], path: str = "", revisions: Mapping[str, Any] | None = None
) -> list[str]:
    """Config keys of downloads without a checksum: a `<x>sha256` key that is null beside a non-null `<x>url`, or a
    null entry of a `sha256` mapping beside a `base_url`, whose URL the lock file does not hold either; and a Hub
    reference (`hub: <repo id>`, `repo_type`, `revision`) whose `revision` is null and not in the lock's revisions."""
    out: list[str] = []
    if isinstance(cfg, Mapping):
        if cfg.get("hub") and "revision" in cfg and cfg["revision"] is None:
            ref = f"{cfg.get('repo_type', 'model')}:{cfg['hub']}"
            if ref not in (revisions or {}):
                out.append(f"{path}.revision" if path else "revision")
        for key, value in cfg.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "revision":
                continue
            if str(key).endswith("sha256"):
                url = cfg.get(str(key)[: -len("sha256")] + "url")
                if value is None and url and url not in lock:
                    out.append(where)
                elif isinstance(value, Mapping) and cfg.get("base_url"):
                    out += [f"{where}.{k}" for k, v in value.items() if not v and not _locked(lock, cfg["base_url"])]
            else:
                out += unpinned_downloads(value, lock, where, revisions)
    elif isinstance(cfg, list):
        for i, value in enumerate(cfg):
            out += unpinned_downloads(value, lock, f"{path}[{i}]", revisions)
    return out


UNPINNED_FILE = Path("config") / "unpinned.yaml"


def unpinned_reasons(root: str | Path) -> dict[str, dict[str, str]]:
    """{slug: {config key: why no published checksum was found}} from `config/unpinned.yaml` ({} without it)."""
    import yaml

    path = Path(root) / UNPINNED_FILE
    doc = yaml.safe_load(path.read_text()) if path.is_file() else None
    return {str(slug): {str(k): str(v) for k, v in (keys or {}).items()} for slug, keys in (doc or {}).items()}


def _stage_order(item: tuple[str, int]) -> tuple[int, str]:
    """Rules in pipeline order (downloads, preprocessing, the rest, evaluation, report), then by name: the dry
    run's own job order varies between runs."""
    rule = item[0]
    for rank, word in enumerate(("download", "preprocess")):
        if word in rule:
            return rank, rule
    return {"evaluate": 3, "report": 4}.get(rule.split("_")[0], 2), rule


def _locked(lock: Mapping[str, Any], base_url: str) -> bool:
    return any(str(u).startswith(base_url) for u in lock)


def plan_rows(jobs: Iterable[PlannedJob], papers: Sequence[str], scale: str, root: str | Path) -> list[dict]:
    rows = []
    jobs = list(jobs)
    for slug in papers:
        mine = [j for j in jobs if j.rule.startswith(f"{slug}_")]
        gpu = [j for j in mine if j.gpus]
        per_rule = Counter(j.rule.removeprefix(f"{slug}_") for j in mine)
        unpinned = unpinned_downloads(
            load_paper_config(slug, scale, Path(root)), read_lock(slug, root), revisions=read_lock_revisions(slug, root)
        )
        rows.append(
            {
                "paper": slug,
                "jobs": len(mine),
                "jobs per rule": ", ".join(f"{r} {n}" for r, n in sorted(per_rule.items(), key=_stage_order)),
                "GPU jobs": len(gpu),
                "GPUs per job: jobs": ", ".join(f"{n}: {k}" for n, k in sorted(Counter(j.gpus for j in gpu).items()))
                or "-",
                "GPU-hours": round(sum(j.gpus * j.hours for j in gpu), 1),
                "CPU-hours": round(sum(j.threads * j.hours for j in mine if not j.gpus), 1),
                "max memory (GB)": round(max((j.mem_gb for j in mine), default=0.0), 1),
                "unpinned downloads": len(unpinned),
                "unpinned keys": ", ".join(unpinned) or "-",
            }
        )
    return rows


def render(
    rows: Sequence[Mapping[str, Any]], scale: str, reasons: Mapping[str, Mapping[str, str]] | None = None
) -> str:
    cols = list(rows[0]) if rows else []
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |" for r in rows]
    total_gpu = sum(r["GPU-hours"] for r in rows)
    total_cpu = sum(r["CPU-hours"] for r in rows)
    missing = sum(r["unpinned downloads"] for r in rows)
    lines.append("")
    lines.append(
        f"Scale `{scale}`: {sum(r['jobs'] for r in rows)} jobs, {sum(r['GPU jobs'] for r in rows)} on GPUs, "
        f"{total_gpu:.0f} GPU-hours and {total_cpu:.0f} CPU-hours requested (runtime limits, not measurements); "
        f"{missing} download(s) without a checksum (`paperflow pin <slug>` fills them)."
    )
    if missing:
        lines += [
            "",
            "Downloads that only `paperflow pin` can fill, and why no published checksum was found "
            f"(`{UNPINNED_FILE.as_posix()}`):",
            "",
        ]
        for row in rows:
            for key in [k for k in str(row["unpinned keys"]).split(", ") if k != "-"]:
                why = (reasons or {}).get(row["paper"], {}).get(key, "no reason recorded")
                lines.append(f"- `{row['paper']}` `{key}`: {why}")
    return "\n".join(lines)


PLAN_BEGIN = "<!-- plan: generated by `paperflow plan --scale paper --readme README.md`; do not edit -->"
PLAN_END = "<!-- plan: end -->"


_INT_COLUMNS = ("jobs", "GPU jobs", "unpinned downloads")
_FLOAT_COLUMNS = ("GPU-hours", "CPU-hours", "max memory (GB)")


def readme_rows(readme: str | Path) -> list[dict]:
    """The rows of the plan table in `readme`'s plan block, as `plan_rows` gives them ([] without a table)."""
    text = Path(readme).read_text()
    if PLAN_BEGIN not in text:
        return []
    block = text[text.index(PLAN_BEGIN) + len(PLAN_BEGIN) : text.index(PLAN_END)]
    lines = [line for line in block.splitlines() if line.startswith("|")]
    if len(lines) < 2:
        return []
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip().replace("\\|", "|") for c in line.strip().strip("|").split(" | ")]
        row: dict[str, Any] = dict(zip(cols, cells))
        for col in _INT_COLUMNS:
            row[col] = int(row[col])
        for col in _FLOAT_COLUMNS:
            row[col] = float(row[col]) if "." in row[col] else int(row[col])
        rows.append(row)
    return rows


def merge_rows(old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], order: Sequence[str]) -> list:
    """`old` rows with the papers of `new` replaced (or added), in the order of `order`."""
    by_paper = {r["paper"]: r for r in old} | {r["paper"]: r for r in new}
    return [by_paper[p] for p in order if p in by_paper]


def write_readme_block(readme: str | Path, table: str) -> bool:
    path = Path(readme)
    text = path.read_text()
    if text.count(PLAN_BEGIN) != 1 or text.count(PLAN_END) != 1:
        raise ValueError(f"{path} needs one plan block between {PLAN_BEGIN!r} and {PLAN_END!r}")
    start = text.index(PLAN_BEGIN) + len(PLAN_BEGIN)
    new = text[:start] + "\n" + table + "\n" + text[text.index(PLAN_END) :]
    if new != text:
        path.write_text(new)
    return new != text
