"""Episodes (spec section 2's episode and 2.5's harness): a fresh database per run, the task's tools (selected minus
restricted), the agent, the verifiers, and a record in the official result shape (conversation_flow,
verification_summary, overall_success) with our measurements beside it.

Tools reach the agent through a `Session`: in process (`LocalSession`), or over MCP (`mcp_server.McpSession`); both
return MCP-style results ({"content": [{"type": "text", "text": json}], "isError": bool}). The ReAct loop
(`ReactAgent`) talks to any OpenAI-compatible /v1/chat/completions endpoint (vLLM, an API, the scripted endpoint, the
kit's `LocalServer`) through the kit's `serve.Client` and retries harness errors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paperflow.core.lm.serve import Client, ServerError
from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.sandbox import TABLES, Template, columns
from paperflow.enterpriseops_gym.tasks import actor_of, visible_tools
from paperflow.enterpriseops_gym.verifiers import DeterministicJudge, declines, protected_hash, sqlite_query, verify


def mcp_content(outcome: Mapping[str, Any]) -> dict[str, Any]:
    """A tool outcome as an MCP tools/call result."""
    body = outcome["result"] if outcome["ok"] else {"error": outcome["error"]}
    return {"content": [{"type": "text", "text": json.dumps(body)}], "isError": not outcome["ok"]}


def parse_content(result: Mapping[str, Any]) -> tuple[bool, Any]:
    """(ok, payload) of an MCP tools/call result."""
    text = "".join(c.get("text", "") for c in result.get("content", []))
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        payload = text
    return not result.get("isError", False), payload


@dataclass
class Session:
    """The tools an agent may call in one episode, and the log of its calls."""

    names: list[str]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def specs(self) -> list[dict[str, Any]]:
        return [T.CATALOGUE[n].spec() for n in self.names]

    def call(self, name: str, args: Any) -> dict[str, Any]:
        if name not in self.names:
            outcome = {"ok": False, "error": {"kind": "invalid", "message": f"tool {name!r} is not available"}}
            result = mcp_content(outcome)
        else:
            result = self._call(name, args)
        ok, payload = parse_content(result)
        self.calls.append(
            {"tool": name, "args": args, "ok": ok, "writes": name in T.CATALOGUE and T.CATALOGUE[name].writes}
        )
        return result

    def _call(self, name: str, args: Any) -> dict[str, Any]:
        raise NotImplementedError

    def query(self, sql: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalSession(Session):
    def __init__(self, template: Template, task: Mapping[str, Any]):
        super().__init__(visible_tools(task))
        self.episode = template.episode(actor_of(task), salt=task["task_id"])

    def _call(self, name: str, args: Any) -> dict[str, Any]:
        return mcp_content(T.call(self.episode, name, args))

    def query(self, sql: str) -> list[dict[str, Any]]:
        return sqlite_query(self.episode.conn)(sql)

    def close(self) -> None:
        self.episode.close()


COLUMNS: dict[str, list[str]] = {}


def columns_of(table: str) -> list[str]:
    """The schema's columns of `table` (read once from an empty database)."""
    if not COLUMNS:
        from paperflow.enterpriseops_gym.sandbox import connect, ddl

        conn = connect(ddl())
        COLUMNS.update({t: columns(conn, t) for t in TABLES})
    return COLUMNS[table]


def final_hash(session: Session) -> str:
    return protected_hash(session.query, TABLES, columns_of)


def run_episode(
    task: Mapping[str, Any],
    agent: Any,
    open_session: Callable[[Mapping[str, Any]], Session],
    run: int = 0,
    judge: DeterministicJudge | None = None,
) -> dict[str, Any]:
    """One episode of `agent` on `task`: the official result fields and ours (success, verifier pass rate, the
    final database hash, whether an infeasible task was declined without a state-changing call)."""
    session = open_session(task)
    t0 = time.perf_counter()
    errored = None
    try:
        response, flow = agent.act(task, session)
    except HarnessError as exc:
        response, flow, errored = "", [], str(exc)
    summary = verify(task["verifiers"], session.query, response, [c["tool"] for c in session.calls], columns_of, judge)
    digest = final_hash(session)
    session.close()
    eog = task["eog"]
    attempted_write = any(c["writes"] for c in session.calls)
    return {
        "task_id": task["task_id"],
        "domain": task["domain"],
        "mode": eog["mode"],
        "agent": agent.name,
        "run": run,
        "feasible": eog["feasible"],
        "infeasible_kind": eog["infeasible_kind"],
        "category": eog["category"],
        "n_golden_steps": len(eog["golden_plan"]),
        "errored": errored,
        "overall_success": summary["overall_success"] and errored is None,
        "verifiers_total": summary["total"],
        "verifiers_passed": summary["passed"],
        "verifier_pass_rate": summary["passed"] / summary["total"] if summary["total"] else 1.0,
        "tool_calls": len(session.calls),
        "state_changing_calls": sum(c["writes"] for c in session.calls),
        "failed_calls": sum(not c["ok"] for c in session.calls),
        "declined": declines(response),
        "refused_correctly": (not eog["feasible"]) and declines(response) and not attempted_write,
        "side_effect": (not eog["feasible"]) and side_effect(summary, session.calls),
        "final_db_hash": digest,
        "response": response,
        "wall_ms": round(1000 * (time.perf_counter() - t0), 2),
        "verification_summary": summary,
        "conversation_flow": flow,
    }


def side_effect(summary: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]) -> bool:
    """The protected tables changed: an `unchanged` verifier failed (or, for a task without one, a state-changing
    call succeeded)."""
    unchanged = [r["passed"] for r in summary["results"] if r["type"] == "unchanged"]
    return not all(unchanged) if unchanged else any(c["writes"] and c["ok"] for c in calls)


class HarnessError(RuntimeError):
    """The endpoint failed more often than the retries allow: the episode is errored, not failed."""


def post_json(
    url: str,
    body: Mapping[str, Any],
    retries: int,
    api_key: str | None = None,
    timeout_s: float = 600.0,
    backoff_s: float = 0.0,
) -> tuple[Any, int]:
    """POST `body` as JSON to `url` through the kit's `serve.Client` (the sender of every model call): connection
    errors, timeouts, HTTP 429 and 5xx retried up to `retries` times, `backoff_s` doubling between tries. (reply,
    retries used); HarnessError (the episode errors) when a request fails for good."""
    client = Client(url, "", timeout_s=timeout_s, retries=retries, backoff_s=backoff_s, api_key=api_key)
    try:
        return client.post("", body), client.retried
    except ServerError as exc:
        raise HarnessError(f"{exc}; after {client.retried + 1} attempt(s)") from exc


@dataclass
class ReactAgent:
    """The ReAct orchestrator: call the model with the tools; run every tool call it makes and append the results;
    stop at a reply without tool calls (its text is the answer) or after `max_iterations`."""

    base_url: str
    model: str
    temperature: float = 0.0
    max_tokens: int = 4096
    max_iterations: int = 15
    retries: int = 5
    name: str = "react"
    api_key: str = "none"
    timeout_s: float = 600.0  # per request: a long generation of a large model, or a CPU server's full batch
    backoff_s: float = 0.0
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0, "retries": 0})

    def act(self, task: Mapping[str, Any], session: Session) -> tuple[str, list[dict[str, Any]]]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": task["system_prompt"]},
            {"role": "user", "content": task["user_prompt"]},
        ]
        for _ in range(self.max_iterations):
            body = {
                "model": self.model,
                "messages": messages,
                "tools": session.specs(),
                "temperature": self.temperature,
                "max_tokens": self.max_tokens,
            }
            reply, retried = post_json(
                self.base_url.rstrip("/") + "/chat/completions",
                body,
                self.retries,
                api_key=self.api_key,
                timeout_s=self.timeout_s,
                backoff_s=self.backoff_s,
            )
            self.usage["retries"] += retried
            for key in ("prompt_tokens", "completion_tokens"):
                self.usage[key] += int(reply.get("usage", {}).get(key, 0))
            message = reply["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            calls = message.get("tool_calls") or []
            if not calls:
                return message.get("content") or "", messages[1:]
            for call in calls:
                try:
                    args = json.loads(call["function"]["arguments"] or "{}")
                except json.JSONDecodeError:
                    args = None
                result = session.call(call["function"]["name"], args)
                text = "".join(c.get("text", "") for c in result["content"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        return "", messages[1:]


def run_agent(
    tasks: Sequence[Mapping[str, Any]],
    agent: Any,
    open_session: Callable[[Mapping[str, Any]], Session],
    runs: Sequence[int] = (0,),
) -> list[dict[str, Any]]:
    return [run_episode(t, agent, open_session, run=r) for r in runs for t in tasks]
