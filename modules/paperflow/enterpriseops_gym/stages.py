"""The pipeline's stages without the agents' transports (those are in `runs`): the sandbox ("download"), the task
set ("preprocess"), the task-set validation with the mutation test and the alternative plans, and the episode table ("evaluate")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.enterpriseops_gym import agents as A
from paperflow.enterpriseops_gym.alternatives import check_alternatives
from paperflow.enterpriseops_gym.harness import LocalSession, run_episode
from paperflow.enterpriseops_gym.mutation import mutation_test
from paperflow.enterpriseops_gym.sandbox import Template, WorldSize, world_sql
from paperflow.enterpriseops_gym.tasks import build_tasks, load_task
from paperflow.enterpriseops_gym.verifiers import sqlite_query, verify

OFFICIAL_REFUSAL = (
    "enterpriseops_gym source.kind 'official': this stage builds the generated sandbox only; the official task set "
    "(Hugging Face ServiceNow-AI/EnterpriseOps-Gym), gym_dbs.zip and the models are fetched at pinned commits by "
    "the paper-scale rules (workflows/enterpriseops_gym/paper.smk, paperflow.enterpriseops_gym.official); use "
    "source.kind: synthetic here"
)


def download(source: Mapping[str, Any], world: Mapping[str, Any], out: str | Path) -> str:
    """The seed database as SQL text (the smoke stand-in for gym_dbs.zip); the official data are refused by name."""
    if source["kind"] != "synthetic":
        raise ConfigError(OFFICIAL_REFUSAL)
    sql = world_sql(int(world["seed"]), WorldSize.from_config(world))
    Path(out).write_text(sql)
    return sql


def write_jsonl(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def preprocess(
    sql_path: str, tasks_cfg: Mapping[str, Any], modes: Sequence[str], outputs: Mapping[str, str]
) -> dict[str, int]:
    """One JSONL file per mode, in the official column layout."""
    ts = build_tasks(
        Path(sql_path).read_text(),
        int(tasks_cfg["n_feasible"]),
        int(tasks_cfg["n_infeasible"]),
        int(tasks_cfg["seed"]),
        modes,
    )
    for mode in modes:
        write_jsonl(outputs[mode], ts.modes[mode])
    return {"tasks": len(ts.tasks), "feasible": sum(t["eog"]["feasible"] for t in ts.tasks)}


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    return [load_task(r) for r in read_jsonl(path)]


def acceptance(tasks: Sequence[Mapping[str, Any]], template: Template) -> pd.DataFrame:
    """Spec check 10.1 per task: golden replay passes every verifier; the untouched seed database (and an empty
    answer) fails at least one verifier of a feasible task and passes every unchanged check of an infeasible one."""
    rows = []
    for task in tasks:
        golden = run_episode(task, A.Golden(), lambda t: LocalSession(template, t))
        ep = template.episode(task["eog"]["actor"], salt=task["task_id"])
        untouched = verify(task["verifiers"], sqlite_query(ep.conn), "", [], _columns)
        ep.close()
        unchanged = [r["passed"] for r in untouched["results"] if r["type"] == "unchanged"]
        feasible = task["eog"]["feasible"]
        rows.append(
            {
                "task_id": task["task_id"],
                "domain": task["domain"],
                "feasible": feasible,
                "n_verifiers": len(task["verifiers"]),
                "golden_passes": golden["overall_success"],
                "seed_fails": not untouched["overall_success"],
                "seed_passes_unchanged": all(unchanged),
                "sound": golden["overall_success"]
                and (not untouched["overall_success"] if feasible else all(unchanged)),
            }
        )
    return pd.DataFrame(rows)


def _columns(table: str) -> list[str]:
    from paperflow.enterpriseops_gym.harness import columns_of

    return columns_of(table)


def reset_isolation(tasks: Sequence[Mapping[str, Any]], template: Template) -> dict[str, Any]:
    """Spec check 10.3: each task's golden run repeated after another task's run (interleaved A, B, A) gives the
    same final database hash; the seed template itself is unchanged afterwards."""
    before = template.episode("", salt="probe").hash()
    agent = A.Golden()
    hashes = []
    for a, b in zip(tasks, list(tasks[1:]) + list(tasks[:1])):
        first = run_episode(a, agent, lambda t: LocalSession(template, t))["final_db_hash"]
        run_episode(b, agent, lambda t: LocalSession(template, t))
        again = run_episode(a, agent, lambda t: LocalSession(template, t))["final_db_hash"]
        hashes.append(first == again)
    after = template.episode("", salt="probe").hash()
    return {"pairs": len(hashes), "identical": int(sum(hashes)), "seed_unchanged": before == after}


def validate(
    sql_path: str, tasks_path: str, mutation_seed: int
) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Spec checks 10.1 and 10.3, the mutation test (mutants must fail) and the alternative plans (must pass)."""
    template = Template(Path(sql_path).read_text())
    tasks = load_tasks(tasks_path)
    table = acceptance(tasks, template)
    isolation = reset_isolation(tasks, template)
    mutants = mutation_test(tasks, template, mutation_seed)
    alternatives = check_alternatives(tasks, template)
    doc = {
        "tasks": len(tasks),
        "sound": int(table["sound"].sum()),
        "reset_isolation": isolation,
        "golden_steps": {t["task_id"]: len(t["eog"]["golden_plan"]) for t in tasks},
    }
    return doc, table, mutants, alternatives


EPISODE_COLUMNS = (
    "task_id",
    "domain",
    "mode",
    "agent",
    "run",
    "feasible",
    "infeasible_kind",
    "category",
    "n_golden_steps",
    "errored",
    "overall_success",
    "verifiers_total",
    "verifiers_passed",
    "verifier_pass_rate",
    "tool_calls",
    "state_changing_calls",
    "failed_calls",
    "declined",
    "refused_correctly",
    "side_effect",
    "final_db_hash",
    "wall_ms",
)


def episode_table(paths: Mapping[str, str]) -> pd.DataFrame:
    """Every agent's episodes as one table (the conversation flows stay in the JSONL traces)."""
    rows = [{k: r[k] for k in EPISODE_COLUMNS} for agent, path in paths.items() for r in read_jsonl(path)]
    frame = pd.DataFrame(rows, columns=list(EPISODE_COLUMNS))
    frame["errored"] = frame["errored"].astype(object).where(frame["errored"].notna(), None)
    return frame
