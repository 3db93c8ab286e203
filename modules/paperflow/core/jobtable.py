"""The jobs a checkout plans, as data: every job of Snakemake's DAG (with --forceall) for some papers at one scale,
each with its rule, wildcards, named inputs, outputs and logs, benchmark, conda env, script, params, threads,
priority, the rule's wildcard constraints and resources.

Two checkouts that plan the same jobs at a scale run the same work there, whatever their workflow text says:
`tests/test_plan_equal.py` holds today's plans against the snapshots in `tests/data/plans/` (a workflow refactor
must not move a job), and `paperflow record restamp` carries a record across such a refactor when the plan at the
record's commit equals today's, code hashes included.

Run as a file (`python .../jobtable.py ROOT SCALE PAPER...`), it prints the table as JSON. It imports nothing of
paperflow: the checkout at ROOT puts its own modules on the path when its Snakefile loads, so one process reads
one checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# resources Snakemake derives from the machine that plans, not from the workflow
MACHINE_RESOURCES = ("tmpdir", "_cores", "_nodes")


def _named(files: Any) -> dict[str, Any]:
    """A Namedlist as {"files": [...], "names": {name: file or [files]}}."""
    names = {}
    for name, value in files.items():
        names[name] = [str(v) for v in value] if isinstance(value, list) else str(value)
    return {"files": [str(f) for f in files], "names": names}


def _plain(value: Any) -> Any:
    """A param's value as JSON data (anything else by its repr, which a refactor must not move either)."""
    return json.loads(json.dumps(value, default=repr, sort_keys=True))


def _source(path: Any, rule: Any, root: Path) -> str | None:
    """A rule's script or conda env file as a path relative to the checkout (None where the rule has none); a
    relative one is relative to the folder of the file that defines the rule."""
    if path is None:
        return None
    if not Path(str(path)).is_absolute() and rule.basedir is not None:
        path = rule.basedir.join(str(path))
    text = str(path.get_path_or_uri(secret_free=True) if hasattr(path, "get_path_or_uri") else path)
    text = text.removeprefix("file://")
    resolved = Path(text) if Path(text).is_absolute() else (root / text)
    try:
        return resolved.resolve().relative_to(root).as_posix()
    except ValueError:
        return text


def _job(job: Any, root: Path) -> dict[str, Any]:
    params = {name: _plain(value) for name, value in job.params.items()}
    resources = {k: _plain(v) for k, v in job.resources.items() if k not in MACHINE_RESOURCES}
    return {
        "rule": job.rule.name,
        "wildcards": {k: str(v) for k, v in job.wildcards.items()},
        "input": _named(job.input),
        "output": _named(job.output),
        "params": params,
        "log": _named(job.log),
        "benchmark": None if job.benchmark is None else str(job.benchmark),
        "conda": _source(job.rule.conda_env, job.rule, root),
        "script": _source(job.rule.script, job.rule, root),
        "threads": job.threads,
        "priority": job.priority,
        "constraints": {k: str(getattr(v, "pattern", v)) for k, v in job.rule._wildcard_constraints.items()},
        "resources": resources,
    }


def _key(job: dict[str, Any]) -> str:
    return json.dumps([job["rule"], job["wildcards"], job["output"]["files"]], sort_keys=True)


def plan_here(root: Path, scale: str, papers: Sequence[str]) -> list[dict[str, Any]]:
    """The job table of the checkout at `root` (this process must not have imported another checkout's paperflow)."""
    import snakemake.api as api
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    config = {"scale": scale, "papers": list(papers)}
    with api.SnakemakeApi(OutputSettings(quiet={Quietness.ALL})) as snake:
        workflow = snake.workflow(
            resource_settings=ResourceSettings(cores=2),
            config_settings=ConfigSettings(config=config),
            snakefile=root / "Snakefile",
            workdir=root,
        )
        dag = workflow.dag(DAGSettings(forceall=True))
        dag.execute_workflow(executor="dryrun")
        jobs = [_job(job, root) for job in workflow._workflow.dag.jobs]
    return sorted(jobs, key=_key)


def plan_of(root: str | Path, scale: str, papers: Sequence[str]) -> list[dict[str, Any]]:
    """The job table of the checkout at `root`, read by a fresh interpreter of this environment."""
    root = Path(root).resolve()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(root), scale, *papers],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"the plan of {root} at scale {scale} failed (exit {proc.returncode}): {tail[0]}")
    return json.loads(proc.stdout)


def without_code_hash(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table with each `code` param's hash left out (it moves with any edit of the code a job imports)."""
    out = []
    for job in jobs:
        params = dict(job["params"])
        if isinstance(params.get("code"), dict):
            params["code"] = {k: v for k, v in params["code"].items() if k != "hash"}
        out.append({**job, "params": params})
    return out


def first_difference(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> str | None:
    """None where the tables are equal; else one line naming the first job (and field) that differs."""
    before = {_key(j): j for j in old}
    after = {_key(j): j for j in new}
    for key in sorted(set(before) | set(after)):
        if key not in after:
            return f"job {key} is planned no more"
        if key not in before:
            return f"job {key} is new"
        for field in before[key]:
            if before[key][field] != after[key][field]:
                return f"job {key}: {field} was {json.dumps(before[key][field])[:300]}, now {json.dumps(after[key][field])[:300]}"
    return None


if __name__ == "__main__":
    root_arg, scale_arg, *papers_arg = sys.argv[1:]
    json.dump(plan_here(Path(root_arg).resolve(), scale_arg, papers_arg), sys.stdout, indent=1, sort_keys=True)
