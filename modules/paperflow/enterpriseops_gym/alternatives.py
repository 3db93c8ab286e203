"""The verifiers' other direction: a valid plan that differs from the golden one must still pass (no false negative).
For every feasible task one alternative plan reaches the golden end state by another path:

- `reorder`: another order of the steps that the references allow; a state-changing step keeps its place among the
  state-changing steps and a read stays after the writes that preceded it, so the end state cannot change;
- `route`: where no other order exists, a user found by name instead of by email (`find_user`), when the name is
  unique in the seed database;
- `detour`: otherwise extra read-only calls (`whoami` first, the first lookup made twice and the second result used).

Every alternative also words its final answer differently, and runs on a database that mints other ids (another
salt, as another server would): ids and numbers of new rows differ from golden replay's, so verifiers that pinned them
would reject it. The control is a trajectory-matching checker (the
alternative to state verifiers that a benchmark could use): it accepts a run only when its calls, tools and
resolved arguments, equal golden replay's, so it rejects every valid alternative.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.harness import columns_of
from paperflow.enterpriseops_gym.sandbox import Template
from paperflow.enterpriseops_gym.tasks import REF, replay
from paperflow.enterpriseops_gym.verifiers import sqlite_query, verify

ALTERNATIVE_COLUMNS = ("task_id", "domain", "template", "kind", "steps", "accepted", "trajectory_match")
ANSWER_PREFIX = "All done. "


def references(value: Any) -> set[int]:
    """The 1-based plan steps an argument refers to ("$k.result...")."""
    if isinstance(value, dict):
        return set().union(*(references(v) for v in value.values())) if value else set()
    return {int(m.group(1)) for m in REF.finditer(value)} if isinstance(value, str) else set()


def renumber(value: Any, new: Mapping[int, int]) -> Any:
    """An argument or answer template with every "$k.result" renamed to "$new[k].result"."""
    if isinstance(value, dict):
        return {k: renumber(v, new) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    return REF.sub(lambda m: f"${new[int(m.group(1))]}.result{m.group(2)}", value)


def reordered(plan: Sequence[Mapping[str, Any]]) -> list[int] | None:
    """Another order of the 1-based steps, or None: each time the latest step that may run next (its references run,
    every earlier write run; a write also waits for every earlier step)."""
    writes = [T.CATALOGUE[s["tool"]].writes for s in plan]
    deps = [references(s["args"]) for s in plan]
    order: list[int] = []
    while len(order) < len(plan):
        ready = [
            k
            for k in range(1, len(plan) + 1)
            if k not in order
            and deps[k - 1] <= set(order)
            and all(j in order for j in range(1, k) if writes[j - 1] or writes[k - 1])
        ]
        order.append(max(ready))
    return None if order == sorted(order) else order


def _apply(plan: Sequence[Mapping[str, Any]], final: str, order: Sequence[int]) -> tuple[list[dict], str]:
    new = {old: i for i, old in enumerate(order, 1)}
    steps = [{"tool": plan[k - 1]["tool"], "args": renumber(plan[k - 1]["args"], new)} for k in order]
    return steps, renumber(final, new)


def alternative(
    plan: Sequence[Mapping[str, Any]], final: str, template: Template
) -> tuple[str, list[dict[str, Any]], str]:
    """(kind, plan, final-answer template) of the task's alternative plan."""
    order = reordered(plan)
    if order is not None:
        steps, answer = _apply(plan, final, order)
        return "reorder", steps, ANSWER_PREFIX + answer
    for i, step in enumerate(plan):
        if step["tool"] == "find_user" and "email" in step["args"] and not REF.search(step["args"]["email"]):
            names = template.conn.execute(
                "SELECT name FROM users WHERE name = (SELECT name FROM users WHERE email = ?)", (step["args"]["email"],)
            ).fetchall()
            if len(names) == 1:
                steps = [dict(s) for s in plan]
                steps[i] = {"tool": "find_user", "args": {"name": names[0][0]}}
                return "route", steps, ANSWER_PREFIX + final
    # detour: whoami, the first step twice, then the rest with the first step's references moved to its repeat
    new = {1: 3} | {k: k + 2 for k in range(2, len(plan) + 1)}
    steps = [
        {"tool": "whoami", "args": {}},
        dict(plan[0]),
        {"tool": plan[0]["tool"], "args": dict(plan[0]["args"])},
    ]
    steps += [{"tool": s["tool"], "args": renumber(s["args"], new)} for s in plan[1:]]
    return "detour", steps, ANSWER_PREFIX + renumber(final, new)


def _signature(calls: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(c["tool"], repr(sorted(c["args"].items()))) for c in calls]


def check_alternatives(tasks: Sequence[Mapping[str, Any]], template: Template) -> pd.DataFrame:
    """One row per feasible task: its alternative plan's kind, whether every verifier accepts it (`accepted`; replayed
    under another salt, so minted ids differ) and
    whether the trajectory-matching control does (`trajectory_match`: the calls equal golden replay's)."""
    rows = []
    for task in tasks:
        eog = task["eog"]
        if not eog["feasible"]:
            continue
        ep = template.episode(eog["actor"], salt=task["task_id"])
        golden_calls, _ = replay(ep, eog["golden_plan"], eog["final_answer"])
        ep.close()
        kind, plan, final = alternative(eog["golden_plan"], eog["final_answer"], template)
        ep = template.episode(eog["actor"], salt=f"{task['task_id']}:alternative")
        calls, answer = replay(ep, plan, final)
        summary = verify(task["verifiers"], sqlite_query(ep.conn), answer, [c["tool"] for c in calls], columns_of)
        ep.close()
        rows.append(
            {
                "task_id": task["task_id"],
                "domain": task["domain"],
                "template": eog["template"],
                "kind": kind,
                "steps": len(plan),
                "accepted": bool(summary["overall_success"]),
                "trajectory_match": _signature(calls) == _signature(golden_calls),
            }
        )
    return pd.DataFrame(rows, columns=list(ALTERNATIVE_COLUMNS))
