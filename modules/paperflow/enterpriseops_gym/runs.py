"""The agent runs (the pipeline's train stage: at paper scale the model calls happen here): one agent on every mode's
tasks, each episode on a fresh database. The offline agents use the tools in process; the mock LLM runs the ReAct
harness against the scripted OpenAI-compatible endpoint on loopback, and reaches the tools over MCP (the `mcp`
package's client and server) or in process, as `mock_llm.transport` says."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.enterpriseops_gym import agents as A
from paperflow.enterpriseops_gym.endpoint import Endpoint, ScriptedModel
from paperflow.enterpriseops_gym.harness import LocalSession, ReactAgent, run_episode
from paperflow.enterpriseops_gym.sandbox import Template
from paperflow.enterpriseops_gym.stages import load_tasks

AGENTS = ("noop", "random", "heuristic", "golden", "golden_guided", "golden_literal", "mock_llm")


def run_agent(
    agent: str, sql_path: str, task_paths: Mapping[str, str], settings: Mapping[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every episode of `agent` over the modes' task files; (episode records, notes on the run)."""
    sql = Path(sql_path).read_text()
    template = Template(sql)
    tasks = {mode: load_tasks(path) for mode, path in task_paths.items()}
    local = lambda t: LocalSession(template, t)
    if agent == "random":
        r = settings["random"]
        records = [
            run_episode(t, A.RandomAgent(seed, r["max_calls"]), local, run=i)
            for i, seed in enumerate(r["seeds"])
            for mode_tasks in tasks.values()
            for t in mode_tasks
        ]
        return records, {"seeds": list(r["seeds"])}
    if agent in A.OFFLINE:
        bot = A.OFFLINE[agent]()
        return [run_episode(t, bot, local) for mode_tasks in tasks.values() for t in mode_tasks], {}
    if agent == "mock_llm":
        return run_mock(sql, template, [t for ts in tasks.values() for t in ts], settings)
    raise ValueError(f"agent {agent!r} not in {AGENTS}")


def run_mock(sql: str, template: Template, tasks: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]):
    h, m = settings["harness"], settings["mock_llm"]
    model = ScriptedModel(tasks, bad_step=m["bad_step"], http_errors=m["http_errors"])
    with Endpoint(model) as url:
        agent = ReactAgent(
            url,
            "scripted-mock",
            temperature=h["temperature"],
            max_tokens=h["max_tokens"],
            max_iterations=h["max_iterations"],
            retries=h["retries"],
            name="mock_llm",
        )
        if m["transport"] == "mcp":
            from paperflow.enterpriseops_gym.mcp_server import GymServer, Loop, McpSession

            with GymServer() as server:
                loop = Loop()
                try:
                    records = [run_episode(t, agent, lambda t: McpSession(server.url, sql, t, loop)) for t in tasks]
                finally:
                    loop.close()
        else:
            records = [run_episode(t, agent, lambda t: LocalSession(template, t)) for t in tasks]
    return records, {"transport": m["transport"], "usage": dict(agent.usage), "endpoint_requests": model.requests}
