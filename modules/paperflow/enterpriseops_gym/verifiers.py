"""Verifiers with the official harness's semantics (benchmark/verifier.py, spec section 2) plus the collateral-damage
check of AppWorld.

- database_state {query, expected_value, comparison_type}: the query's rows are extracted by shape (1 row x 1
  column -> the scalar, 1 row -> a dict, otherwise a list of dicts; no row -> an empty list) and compared with
  equals | greater_than | less_than | contains ("contains": str(expected) in str(actual)).
- response_check {sql_query, comparison_prompt, minimum_comparison_value (default 7)}: the SQL result and the
  agent's final text go to a judge that scores 0-10; pass if score >= minimum. At smoke scale the judge is
  deterministic (`DeterministicJudge`: the rule named by our extra key `judge_rule`); at paper scale an LLM.
- tool_execution {selected_tools, minimum_tool_calls}: every listed tool was called, and at least the minimum
  number of calls were made.
- unchanged {tables, expected_hash} (ours): the sorted rows of the protected tables hash to the seed's hash.

Task success = every verifier passes (an empty verifier list passes, as in the official code).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paperflow.enterpriseops_gym.sandbox import rows_hash, sorted_rows_sql

Query = Callable[[str], list[dict[str, Any]]]
COMPARISONS = ("equals", "greater_than", "less_than", "contains")
DECLINE = re.compile(
    r"\b(cannot|can't|unable|not (?:able|allowed|permitted|possible)|decline|refuse|does not exist|no such)\b", re.I
)


def extract(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The official shape rule: scalar for 1 x 1, dict for one row, list of dicts otherwise."""
    rows = [dict(r) for r in rows]
    if len(rows) == 1 and len(rows[0]) == 1:
        return next(iter(rows[0].values()))
    if len(rows) == 1:
        return rows[0]
    return rows


def compare(actual: Any, expected: Any, comparison_type: str) -> bool:
    if comparison_type == "equals":
        return actual == expected
    if comparison_type == "greater_than":
        return _number(actual) is not None and _number(actual) > float(expected)
    if comparison_type == "less_than":
        return _number(actual) is not None and _number(actual) < float(expected)
    if comparison_type == "contains":
        return str(expected) in str(actual)
    raise ValueError(f"comparison_type {comparison_type!r} not in {COMPARISONS}")


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def normalise(text: Any) -> str:
    return " ".join(re.sub(r"[^\w@.\- ]", " ", str(text).lower()).split())


def declines(response: str) -> bool:
    return bool(DECLINE.search(response or ""))


class DeterministicJudge:
    """The smoke-scale stand-in for the LLM judge: 10 when the rule holds, 0 otherwise.
    contains_sql_result: the normalised SQL result appears in the normalised response; declines: the response
    refuses (a refusal phrase is present)."""

    def score(self, rule: str, sql_result: Any, response: str) -> float:
        if rule == "contains_sql_result":
            values = sql_result.values() if isinstance(sql_result, dict) else [sql_result]
            return 10.0 if all(normalise(v) in normalise(response) for v in values) and values else 0.0
        if rule == "declines":
            return 10.0 if declines(response) else 0.0
        raise ValueError(f"judge_rule {rule!r} not in contains_sql_result, declines")


def protected_hash(query: Query, tables: Sequence[str], columns_of: Callable[[str], list[str]]) -> str:
    return rows_hash({t: [tuple(r.values()) for r in query(sorted_rows_sql(t, columns_of(t)))] for t in tables})


def run_verifier(
    v: Mapping[str, Any],
    query: Query,
    response: str,
    calls: Sequence[str],
    columns_of: Callable[[str], list[str]],
    judge: DeterministicJudge,
) -> dict[str, Any]:
    kind = v["verifier_type"]
    if kind == "database_state":
        actual = extract(query(v["query"]))
        ok = compare(actual, v["expected_value"], v["comparison_type"])
        return {"name": v["name"], "type": kind, "passed": ok, "actual": actual}
    if kind == "response_check":
        result = extract(query(v["sql_query"]))
        score = judge.score(v.get("judge_rule", "contains_sql_result"), result, response)
        return {
            "name": v["name"],
            "type": kind,
            "passed": score >= v.get("minimum_comparison_value", 7),
            "score": score,
        }
    if kind == "tool_execution":
        ok = set(v["selected_tools"]) <= set(calls) and len(calls) >= v.get("minimum_tool_calls", 1)
        return {"name": v["name"], "type": kind, "passed": ok}
    if kind == "unchanged":
        digest = protected_hash(query, v["tables"], columns_of)
        return {"name": v["name"], "type": kind, "passed": digest == v["expected_hash"]}
    raise ValueError(f"verifier_type {kind!r} not in database_state, response_check, tool_execution, unchanged")


def verify(
    verifiers: Sequence[Mapping[str, Any]],
    query: Query,
    response: str,
    calls: Sequence[str],
    columns_of: Callable[[str], list[str]],
    judge: DeterministicJudge | None = None,
) -> dict[str, Any]:
    """The verification summary of one episode: every verifier's result, the counts, and overall success."""
    judge = judge or DeterministicJudge()
    results = [run_verifier(v, query, response, calls, columns_of, judge) for v in verifiers]
    passed = sum(r["passed"] for r in results)
    return {"results": results, "total": len(results), "passed": passed, "overall_success": passed == len(results)}


def sqlite_query(conn) -> Query:
    """A `Query` over an sqlite3 connection (rows as dicts, column order kept)."""

    def run(sql: str) -> list[dict[str, Any]]:
        cur = conn.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    return run
