"""The mutation test of spec section 11: the golden plan of a multi-step task with one step removed, or with one
literal argument perturbed, must fail at least one verifier. A task is caught when every one of its mutants fails.
Each mutant is also checked by the task's row-count verifiers alone (`caught_row_count_only`): a coarse state check
that sees deleted steps but not perturbed values, the control of the mutation claim.

Perturbations stay plausible: an enum value becomes another allowed value, an integer another value in its range,
a string that names something in the seed database (an email, a number, a name) becomes another value of the same
column, and free text gets an edit.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.harness import columns_of
from paperflow.enterpriseops_gym.sandbox import TABLES, Template
from paperflow.enterpriseops_gym.tasks import REF, replay
from paperflow.enterpriseops_gym.verifiers import sqlite_query, verify


def value_index(template: Template) -> dict[str, list[str]]:
    """Every text value of the seed database -> the other values of its column."""
    index: dict[str, list[str]] = {}
    for table in TABLES:
        for col in columns_of(table):
            values = sorted(
                {r[0] for r in template.conn.execute(f"SELECT {col} FROM {table}") if isinstance(r[0], str)}
            )
            for v in values:
                index.setdefault(v, [w for w in values if w != v])
    return index


def perturb(value: Any, spec: Mapping[str, Any], index: Mapping[str, list[str]], rng: random.Random) -> Any:
    if "enum" in spec:
        return rng.choice([v for v in spec["enum"] if v != value])
    if spec.get("type") == "integer":
        return rng.choice([v for v in range(spec.get("minimum", 0), spec.get("maximum", 9) + 1) if v != value])
    if isinstance(value, str) and index.get(value):
        return rng.choice(index[value])
    return f"{value} (revised)"


def mutants(
    plan: Sequence[Mapping[str, Any]], index: Mapping[str, list[str]], rng: random.Random
) -> list[tuple[str, list]]:
    """(label, plan) for every single-step deletion and one perturbed literal argument per step that has one."""
    out = [(f"drop step {i + 1}", [{**s, "skip": j == i} for j, s in enumerate(plan)]) for i in range(len(plan))]
    for i, step in enumerate(plan):
        literal = [k for k, v in step["args"].items() if not (isinstance(v, str) and REF.search(v))]
        if not literal:
            continue
        key = rng.choice(sorted(literal))
        spec = T.CATALOGUE[step["tool"]].parameters["properties"][key]
        new = perturb(step["args"][key], spec, index, rng)
        changed = [dict(s) for s in plan]
        changed[i] = {"tool": step["tool"], "args": {**step["args"], key: new}}
        out.append((f"perturb step {i + 1} {key}", changed))
    return out


def mutation_test(tasks: Sequence[Mapping[str, Any]], template: Template, seed: int) -> pd.DataFrame:
    """One row per mutant of every feasible task with >= 2 golden steps: whether some verifier failed. A deleted
    step is skipped, so later references to its result stay unresolved (as a replay without it would leave them)."""
    index = value_index(template)
    rows = []
    for task in tasks:
        eog = task["eog"]
        if not eog["feasible"] or len(eog["golden_plan"]) < 2:
            continue
        rng = random.Random(f"{seed}:{task['task_id']}")
        for label, plan in mutants(eog["golden_plan"], index, rng):
            ep = template.episode(eog["actor"], salt=task["task_id"])
            calls, answer = replay(ep, plan, eog["final_answer"])
            tools = [c["tool"] for c in calls]
            summary = verify(task["verifiers"], sqlite_query(ep.conn), answer, tools, columns_of)
            coarse = verify(row_count_verifiers(task["verifiers"]), sqlite_query(ep.conn), answer, tools, columns_of)
            ep.close()
            rows.append(
                {
                    "task_id": task["task_id"],
                    "domain": task["domain"],
                    "mutant": label,
                    "kind": label.split()[0],
                    "caught": not summary["overall_success"],
                    "failed_verifiers": summary["total"] - summary["passed"],
                    "caught_row_count_only": not coarse["overall_success"],
                }
            )
    return pd.DataFrame(rows, columns=list(MUTATION_COLUMNS))


MUTATION_COLUMNS = ("task_id", "domain", "mutant", "kind", "caught", "failed_verifiers", "caught_row_count_only")


def row_count_verifiers(verifiers: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The verifiers that only count the rows of a changed table (tasks.py names them "<table>: row count")."""
    return [v for v in verifiers if "row count" in v.get("name", "")]
