"""Side by side (issue 48): the official EnterpriseOps-Gym harness's verifiers and scoring against ours, on our
smoke-scale world and tasks.

Verdicts. Each agent's episode runs through our MCP server (`paperflow.enterpriseops_gym.mcp_server.GymServer`,
started in process on loopback, as the tests start it) with the real episode code (`harness.run_episode` over an
`McpSession`): that gives our verdict. Before the episode's database is deleted, the official
`BenchmarkExecutor._run_verifiers` (benchmark/executor.py) runs the task's verifiers with the official
`VerifierEngine` (benchmark/verifier.py: its SQL path through our /api/sql-runner with its headers, its result
extraction, its comparisons, its response-text extraction and judge-reply parsing) and an official `MCPClient`
(benchmark/mcp_client.py) pointed at our server: that gives the official verdict (success = every verifier passed,
as execute_single_run decides it). response_check needs an LLM judge there; here its `llm.ainvoke` is a
deterministic stand-in that scores the official prompt's database result (extracted by the official code) and
response with our `DeterministicJudge` rule, so a response_check verdict checks the plumbing, not a judge.
Our extra verifier type `unchanged` (the collateral-damage hash) is not an official type: the official engine
answers "Unsupported verifier type" (a failure). Agreement is given both on the task files as shipped and on the
verifiers both sides run (`unchanged` left out of both verdicts).

Scores. compute_score.py's `process_mode` / `get_score`, run on per-task result files in the official shape
(statistics from the official `BenchmarkExecutor._calculate_statistics`) written from our runs JSONL (an errored
episode as the official executor records one: {"run_number", "error", "overall_success": false}); its rates
against our `metrics.summary` (errored episodes as failures).

The official functions and classes are taken by name from the checkout's files with `ast` and compiled unchanged
into namespaces holding what they import (httpx, json, logging, typing; stand-ins for langchain_core's
SystemMessage / HumanMessage, not installed, which the judge call only reads `.content` of). Nothing of them is
copied. Every file read is checked against its git blob id at the pinned commit first.

Usage (from the repository root; no network, no GPU; gym_dbs.zip is absent from the mirror: name the paths, and
git's "invalid object ... gym_dbs.zip" message is harmless):

    G=/work/.mirror/ServiceNow+EnterpriseOps-Gym/repo; C=271f2c357f763376997dfd16807fcde2474ae41b
    mkdir -p /tmp/eog_official && git --git-dir=$G archive $C benchmark compute_score.py | tar -x -C /tmp/eog_official
    PYTHONPATH=modules .venv/bin/python tools/sidebyside/enterpriseops_gym/run.py --official /tmp/eog_official \
        --commit $C --out workflows/enterpriseops_gym/sidebyside.md \
        [--runs results/smoke/enterpriseops_gym/runs results/cpu/enterpriseops_gym/runs] [--tasks-per-mode N]
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pandas as pd

from paperflow.core.config import load_paper_config
from paperflow.enterpriseops_gym import agents as A
from paperflow.enterpriseops_gym import metrics, stages
from paperflow.enterpriseops_gym.harness import run_episode
from paperflow.enterpriseops_gym.mcp_server import GymServer, Loop, McpSession
from paperflow.enterpriseops_gym.official import git_blob_sha1
from paperflow.enterpriseops_gym.tasks import actor_of
from paperflow.enterpriseops_gym.verifiers import DeterministicJudge

REPO = "ServiceNow/EnterpriseOps-Gym"
COMMIT = "271f2c357f763376997dfd16807fcde2474ae41b"  # config/enterpriseops_gym.yaml paper.source.dbs.url
# the git blob ids of the files read, in the tree of COMMIT (`git ls-tree COMMIT benchmark compute_score.py`)
BLOBS = {
    "benchmark/models.py": "ec4014cc14570352f9f731fdea64eeb6b9325314",
    "benchmark/llm_client.py": "f010ca2d2f87aa2551874c8b6a77f743a2fbf1a4",
    "benchmark/mcp_client.py": "19a2a76f02d6258d1b1f5fcb8d7b3ab35bb27f79",
    "benchmark/verifier.py": "4fc02bee132de13652ccc6b301381fe0d7357d92",
    "benchmark/executor.py": "43f45a0423b6fffc1640e6e93b824890b9e1d034",
    "compute_score.py": "943fd82647b5ac6a4863629ef0e7280e89037255",
}
NAMES = {
    "benchmark/models.py": ("VerifierConfig",),
    "benchmark/llm_client.py": ("get_text_content",),
    "benchmark/mcp_client.py": ("MCPClient",),
    "benchmark/verifier.py": ("VerifierEngine",),
    "benchmark/executor.py": ("BenchmarkExecutor._run_verifiers", "BenchmarkExecutor._calculate_statistics"),
    "compute_score.py": ("get_score", "process_mode"),
}
AGENTS = ("golden", "heuristic", "noop", "random", "golden_guided", "golden_literal")
OURS_ONLY = ("unchanged",)
GYM = "eog"  # our tasks' gym_servers_config mcp_server_name


class CheckoutError(RuntimeError):
    """The checkout is not the pinned official code (one line, naming the file or the argument)."""


# ---- loading the official code by name ------------------------------------------------------------------------------


def take(path: Path, names: Sequence[str], namespace: dict) -> dict[str, Any]:
    """The top-level functions / classes `names` of `path` ("Class.method" takes one method as a function), compiled
    unchanged (decorators kept) into `namespace`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    out = {}
    for name in names:
        owner, _, member = name.partition(".")
        node = top.get(owner)
        if node is not None and member:
            node = next(
                (n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == member),
                None,
            )
        if node is None:
            raise CheckoutError(f"{path}: no {name!r} at the top level; not {REPO} at {COMMIT[:8]}")
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
        exec(code, namespace)
        out[name] = namespace[node.name]
    return out


class _Message:
    """What the judge call builds of langchain_core's SystemMessage / HumanMessage (only `.content` is read)."""

    def __init__(self, content: str):
        self.content = content


def load_official(root: str | Path, commit: str) -> dict[str, Any]:
    """The official verifier engine, MCP client, executor methods and compute_score functions of the checkout at
    `root`, after checking `commit` and every file's git blob id against the pinned commit."""
    root = Path(root)
    if commit != COMMIT:
        raise CheckoutError(f"--commit {commit}: the side by side is pinned to {REPO} at {COMMIT}")
    for rel, blob in BLOBS.items():
        path = root / rel
        if not path.is_file():
            raise CheckoutError(f"{path}: missing; {root} is not a checkout of {REPO} at {COMMIT[:8]}")
        got = git_blob_sha1(path)
        if got != blob:
            raise CheckoutError(
                f"{path}: git blob {got[:8]}, {COMMIT[:8]} has {blob[:8]}: a checkout at another commit"
            )
    base = {"__name__": "eog_official", "json": json, "logging": logging, "os": os, "httpx": httpx}
    base |= {k: getattr(typing, k) for k in ("Any", "Dict", "List", "Optional", "Union")}
    base["logger"] = logging.getLogger("eog_official")
    ns_models = _module("eog_official_models", {**base, "dataclass": dataclass})  # dataclass looks its module up
    out = take(root / "benchmark/models.py", NAMES["benchmark/models.py"], ns_models)
    out |= take(root / "benchmark/llm_client.py", NAMES["benchmark/llm_client.py"], dict(base))
    out |= take(root / "benchmark/mcp_client.py", NAMES["benchmark/mcp_client.py"], {**base, "time": time})
    ns_verifier = {
        **base,
        "MCPClient": out["MCPClient"],
        "VerifierConfig": out["VerifierConfig"],
        "get_text_content": out["get_text_content"],
        "LLMClient": object,  # an annotation only; the judge below stands in for it
        "SystemMessage": _Message,
        "HumanMessage": _Message,
    }
    out |= take(root / "benchmark/verifier.py", NAMES["benchmark/verifier.py"], ns_verifier)
    ns_exec = {**base, "VerifierConfig": out["VerifierConfig"]}
    out |= take(root / "benchmark/executor.py", NAMES["benchmark/executor.py"], ns_exec)
    from tqdm import tqdm

    out |= take(root / "compute_score.py", NAMES["compute_score.py"], {**base, "tqdm": _quiet(tqdm)})
    return out


def _module(name: str, items: Mapping[str, Any]) -> dict:
    """A registered module's namespace holding `items` (what `dataclass` needs of the class's module)."""
    module = types.ModuleType(name)
    module.__dict__.update(items, __name__=name)
    sys.modules[name] = module
    return module.__dict__


def _quiet(tqdm):
    return lambda it, **kw: tqdm(it, disable=True, **kw)


# ---- the judge stand-in ---------------------------------------------------------------------------------------------


class StandInJudge:
    """`llm_client` for the official VerifierEngine: `llm.ainvoke(messages)` reads the official judge prompt's
    database result, answer and comparison task back, scores them with our deterministic rule (`judge_rule` of the
    verifier whose comparison_prompt it is) and answers the JSON the official parser expects."""

    def __init__(self, extract):
        self.extract, self.rules, self.llm = extract, {}, self

    async def ainvoke(self, messages):
        text = messages[-1].content
        head, rest = text.split("\n\nAI Assistant Response:\n", 1)
        answer, task = rest.rsplit("\n\nComparison Task:\n", 1)
        result = json.loads(head.removeprefix("Database Query Result:\n"))
        prompt = task.rsplit("\n\nPlease provide your judgment as JSON.", 1)[0]
        value = self.extract({"success": True, "result": result})
        score = DeterministicJudge().score(self.rules[prompt], value, answer)
        return types.SimpleNamespace(content=json.dumps({"score": score, "reasoning": "deterministic stand-in"}))


# ---- one episode, both verdicts -------------------------------------------------------------------------------------


class KeptSession(McpSession):
    """An McpSession whose database outlives run_episode's close, so the official verifiers read the same state."""

    def close(self) -> None:
        self.deferred = True

    def finish(self) -> None:
        McpSession.close(self)


def official_verdicts(off: Mapping[str, Any], server_url: str, task: Mapping[str, Any], session: KeptSession, rec):
    """The official executor's verification of one finished episode: {name: result}."""
    context = {"x-user-id": actor_of(task)}
    client = off["MCPClient"](base_url=server_url, database_id=session.database_id, context=context)
    judge = StandInJudge(None)
    engine = off["VerifierEngine"](client, judge)
    judge.extract = engine._extract_value_from_sql_result
    judge.rules = {
        v["comparison_prompt"]: v.get("judge_rule", "contains_sql_result")
        for v in task["verifiers"]
        if v["verifier_type"] == "response_check"
    }
    host = types.SimpleNamespace(
        config=types.SimpleNamespace(
            verifiers=[official_shape(v) for v in task["verifiers"]], database_id=None, context={}
        ),
        gym_configs=[{"mcp_server_name": GYM, "database_id": session.database_id, "context": context}],
        verifier_engine=engine,
    )
    task_result = {
        "final_response": rec["response"],
        "tool_results": [{"tool_name": c["tool"], "arguments": c["args"]} for c in session.calls],
    }
    return asyncio.run(off["BenchmarkExecutor._run_verifiers"](host, task_result))


def official_shape(v: Mapping[str, Any]) -> dict[str, Any]:
    """Our flat verifier entry in the official task shape: {verifier_type, name, gym_name, validation_config}."""
    rest = {k: x for k, x in v.items() if k not in ("verifier_type", "name")}
    return {"verifier_type": v["verifier_type"], "name": v["name"], "gym_name": GYM, "validation_config": rest}


def load_as_shipped(off: Mapping[str, Any], verifiers: Sequence[Mapping[str, Any]]) -> str | None:
    """What the official executor's `VerifierConfig(**verifier)` says of our verifier entries as written (None: it
    loads them)."""
    try:
        for v in verifiers:
            off["VerifierConfig"](**v)
    except TypeError as exc:
        return str(exc)
    return None


def agent_of(name: str, seed: int, max_calls: int):
    return A.RandomAgent(seed, max_calls) if name == "random" else A.OFFLINE[name]()


def verdict_rows(off, tasks: Sequence[Mapping[str, Any]], sql: str, agents: Sequence[str], settings) -> list[dict]:
    """One row per (agent, seed, task): our verdict and the official one, as shipped and on the shared verifiers."""
    rows = []
    seeds = {a: (list(settings["random"]["seeds"]) if a == "random" else [0]) for a in agents}
    with GymServer() as server:
        loop = Loop()
        try:
            for agent in agents:
                for run, seed in enumerate(seeds[agent]):
                    bot = agent_of(agent, seed, settings["random"]["max_calls"])
                    for task in tasks:
                        kept: list[KeptSession] = []

                        def open_session(t, run=run, kept=kept):
                            kept.append(KeptSession(server.url, sql, t, loop, run=run))
                            return kept[-1]

                        rec = run_episode(task, bot, open_session, run=run)
                        try:
                            theirs = official_verdicts(off, server.url, task, kept[0], rec)
                        finally:
                            kept[0].finish()
                        row = compare_episode(task, agent, run, rec, theirs)
                        rows.append(row | {"as_shipped_error": load_as_shipped(off, task["verifiers"])})
        finally:
            loop.close()
    return rows


def compare_episode(task, agent: str, run: int, rec: Mapping[str, Any], theirs: Mapping[str, Any]) -> dict[str, Any]:
    ours = {r["name"]: r for r in rec["verification_summary"]["results"]}
    types_ = {v["name"]: v["verifier_type"] for v in task["verifiers"]}
    shared = [n for n in ours if types_[n] not in OURS_ONLY]
    differ = [n for n in shared if bool(ours[n]["passed"]) != bool(theirs[n]["passed"])]
    return {
        "agent": agent,
        "run": run,
        "task_id": task["task_id"],
        "mode": task["eog"]["mode"],
        "feasible": task["eog"]["feasible"],
        "errored": rec["errored"],
        "ours": bool(rec["overall_success"]),
        # as execute_single_run decides it: every verifier passed
        "official": all(theirs[n]["passed"] for n in theirs),
        "ours_shared": rec["errored"] is None and all(ours[n]["passed"] for n in shared),
        "official_shared": all(theirs[n]["passed"] for n in shared),
        "verifiers": len(ours),
        "shared_verifiers": len(shared),
        "response_checks": sum(types_[n] == "response_check" for n in shared),
        "differing_verifiers": [
            {
                "name": n,
                "type": types_[n],
                "ours": bool(ours[n]["passed"]),
                "official": bool(theirs[n]["passed"]),
                "official_detail": {k: theirs[n].get(k) for k in ("expected", "actual", "details", "error")},
            }
            for n in differ
        ],
        "unsupported": sorted(n for n, r in theirs.items() if "Unsupported verifier type" in str(r.get("error"))),
    }


def agreement(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    out = []
    for agent, g in frame.groupby("agent", sort=False):
        out.append(
            {
                "agent": agent,
                "episodes": len(g),
                "agree (shared verifiers)": int((g["ours_shared"] == g["official_shared"]).sum()),
                "disagree (shared verifiers)": int((g["ours_shared"] != g["official_shared"]).sum()),
                "ours success": float(g["ours"].mean()),
                "ours success (shared)": float(g["ours_shared"].mean()),
                "official success (shared)": float(g["official_shared"].mean()),
                "agree (as shipped)": int((g["ours"] == g["official"]).sum()),
                "official success (as shipped)": float(g["official"].mean()),
                "verifier verdicts compared": int(g["shared_verifiers"].sum()),
                "of them response_check (stand-in judge)": int(g["response_checks"].sum()),
                "verifier verdicts differing": int(g["differing_verifiers"].map(len).sum()),
            }
        )
    return pd.DataFrame(out)


# ---- compute_score on our runs --------------------------------------------------------------------------------------


def official_run(rec: Mapping[str, Any], number: int) -> dict[str, Any]:
    """One of our episode records as the official executor records a run."""
    if rec["errored"] is not None:
        return {"run_number": number, "error": rec["errored"], "overall_success": False}
    s = rec["verification_summary"]
    return {
        "run_number": number,
        "verification_results": {r["name"]: {"passed": r["passed"]} for r in s["results"]},
        "verification_summary": {
            "total": s["total"],
            "passed": s["passed"],
            "failed": s["total"] - s["passed"],
            "pass_rate": s["passed"] / s["total"] if s["total"] else 0.0,
        },
        "overall_success": rec["overall_success"],
        "tools_used": [],
    }


def run_label(folder: Path) -> str:
    """The scale of a results/<scale>/enterpriseops_gym/runs folder."""
    return folder.resolve().parents[1].name


def scores(off, runs: Mapping[str, Sequence[Mapping[str, Any]]], folder: Path) -> pd.DataFrame:
    """compute_score.py's process_mode per agent and mode on result files written from our runs, beside our
    metrics.summary (errored episodes as failures)."""
    out = []
    for agent, recs in runs.items():
        frame = pd.DataFrame(recs)
        ours = metrics.summary(frame, ["mode"]).set_index("mode")
        ep_rate = metrics.as_failures(frame).groupby("mode")["verifier_pass_rate"].mean()
        for mode, g in frame.groupby("mode", sort=True):
            mode_dir = folder / agent / mode
            mode_dir.mkdir(parents=True)
            for task_id, t in g.groupby("task_id", sort=True):
                result = {"runs": [official_run(r, i + 1) for i, r in enumerate(t.to_dict("records"))]}
                result["statistics"] = off["BenchmarkExecutor._calculate_statistics"](None, result["runs"])
                (mode_dir / f"results_{task_id}.json").write_text(json.dumps(result, default=str))
            got = off["process_mode"](str(mode_dir), mode)
            out.append(
                {
                    "agent": agent,
                    "mode": mode,
                    "tasks": got["total_files"],
                    "files with errors": got["files_with_errors"],
                    "errored episodes (ours)": int(ours.loc[mode, "errored"]),
                    "official success %": got["avg_overall_success_rate"],
                    "our success %": 100 * ours.loc[mode, "success"],
                    "official verifier pass %": got["avg_verifier_pass_rate"],
                    "our verifier pass % (all tasks)": 100 * float(ep_rate[mode]),
                }
            )
    return pd.DataFrame(out)


# ---- the task set and the report ------------------------------------------------------------------------------------


def build(config: Mapping[str, Any], folder: Path) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The smoke world and its tasks, through the pipeline's download and preprocess stages."""
    sql = stages.download(config["source"], config["world"], folder / "seed.sql")
    outputs = {m: str(folder / f"{m}.jsonl") for m in config["modes"]}
    stages.preprocess(str(folder / "seed.sql"), config["tasks"], config["modes"], outputs)
    return sql, {m: stages.load_tasks(p) for m, p in outputs.items()}


def _md(frame: pd.DataFrame) -> str:
    cols = list(frame.columns)
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def report(rows, table: pd.DataFrame, score_table: pd.DataFrame | None, meta: Mapping[str, Any]) -> str:
    frame = pd.DataFrame(rows)
    parts = [
        f"# EnterpriseOps-Gym: the official harness side by side\n\n"
        f"Generated by `tools/sidebyside/enterpriseops_gym/run.py` against {REPO} at `{meta['commit']}` (every file "
        f"read checked against its git blob id there). Tasks: the `{meta['scale']}` world and task set built by the "
        f"pipeline's download and preprocess stages ({meta['tasks']} tasks over modes {', '.join(meta['modes'])}); "
        f"each episode run through our MCP server on loopback, then verified by the official "
        f"`BenchmarkExecutor._run_verifiers` / `VerifierEngine` over our `/api/sql-runner` before the database is "
        f"deleted. Wall time {meta['wall_s']:.0f} s.\n\n"
        "## Verdict agreement per agent\n\n"
        "*Shared verifiers*: both verdicts over the verifiers the official engine supports (database_state, "
        "tool_execution, response_check). *As shipped*: the official verdict with every verifier, "
        "in the official shape (below), where our `unchanged` verifier (collateral-damage hash) is answered "
        '"Unsupported verifier type" and fails.\n\n',
        _md(table),
    ]
    bad = frame[frame["ours_shared"] != frame["official_shared"]]
    parts.append(f"\n### Disagreements (shared verifiers): {len(bad)}\n\n")
    if len(bad):
        for r in bad.to_dict("records"):
            parts.append(
                f"- {r['agent']} run {r['run']}, {r['task_id']} ({r['mode']}): ours {r['ours_shared']}, official "
                f"{r['official_shared']}; verifiers: {json.dumps(r['differing_verifiers'], default=str)}\n"
            )
    else:
        parts.append(
            "None: on every episode both codes give the same task verdict and the same verdict per verifier.\n"
        )
    unsupported = frame[frame["unsupported"].map(len) > 0]
    shipped = frame[frame["ours"] != frame["official"]]
    ours_only = int((shipped["ours"] & ~shipped["official"]).sum())
    errors = sorted({e for e in frame["as_shipped_error"] if e})
    parts.append(
        f"\n### As shipped\n\nOur task files write each verifier flat ({{verifier_type, name, query, expected_value, "
        f"...}}); the official executor builds `VerifierConfig(**verifier)`, which needs the check under "
        f"`validation_config`: on {int(frame['as_shipped_error'].notna().sum())} of {len(frame)} episodes it raises "
        f"{'; '.join(f'`TypeError: {e}`' for e in errors) or 'nothing'}, so the official executor cannot load our "
        "task files as written. The comparisons above move each entry into the official shape (`official_shape`: "
        f"the rest of the entry as validation_config, gym_name `{GYM}`). With that, {len(unsupported)} of "
        f"{len(frame)} episodes have an `unchanged` verifier, which the official engine does not know "
        '(`execute_verifier` returns passed false, "Unsupported verifier type: unchanged"); '
        f"{len(shipped)} episodes then disagree, {ours_only} of them episodes we pass and the official engine fails "
        'on that verifier alone. The official format has no verifier for "these tables did not change": a port of '
        "our tasks to the official harness must express the check as database_state queries, or drop it.\n"
    )
    if score_table is not None:
        parts += [
            f"\n## compute_score.py on our runs JSONL\n\nRuns: {meta['runs']} (scale/agent below). One official result file per (agent, "
            "mode, task) with the official `_calculate_statistics` over its runs (random: one run per seed); "
            "compute_score.py's `process_mode` averages per-task success and verifier pass rates. Ours: "
            "`metrics.summary` success (errored episodes as failures) and the mean per-episode verifier pass rate "
            "(errored as 0).\n\n",
            _md(score_table.round(3)),
        ]
        found, same = meta["recorded"]
        parts.append(
            f"\nOur verdicts over MCP in this run against the recorded runs (in process): {same} of {found} episodes "
            "found in both give the same success.\n"
        )
    parts.append(
        "\n## Differences read in the two codes that these tasks do not reach\n\n"
        "- greater_than / less_than: ours compares numbers (`float(actual) > float(expected)`, a non-number fails); "
        "the official `_compare_values` compares the raw values, so a numeric string against a number raises "
        "TypeError there and the verifier fails. Our tasks use `equals` only; the test "
        "`tests/papers/test_enterpriseops_gym_sidebyside.py` plants one such verifier and sees exactly it differ.\n"
        '- A verifier query that fails: the official engine fails that verifier ("SQL query failed"); our '
        "`McpSession.query` raises (HTTP 400 from /api/sql-runner) and the episode stops with the error. Our "
        "generated queries never fail.\n"
        "- A verifier without gym_name: the official `_run_verifiers` takes `config.database_id` (absent in the "
        "multi-gym layout our tasks use) and the engine falls back to the client's database; `official_shape` names "
        "the gym, as the official task files do.\n"
        "- tool_execution: both read the name of every call made (the official ReAct loop appends each executed call "
        "to `tool_results` whatever its outcome; ours reads the session's call log, refused calls included).\n"
        "- A call outside the task's tool list (orchestrators, not verification): the official `tool_to_server_mapping` "
        "holds every tool the server lists (selected_tools filters only what the model is shown), so such a call is "
        "executed; a name no server lists reaches a bare `raise` in `_execute_tool_call` and errors the run. Ours "
        'refuses both as a failed call ("not available") and the episode goes on. The offline agents call only '
        "listed tools.\n"
    )
    parts.append(
        "\n## What could not run side by side\n\n"
        "- The official orchestrators (orchestrators/react.py and the planners) and `execute_single_run`: they need a "
        "LangChain chat model (`LLMClient`, langchain_core not installed, no network); our agents are offline and run "
        "through our `harness.run_episode`. The official code here starts after the episode: verification and scoring.\n"
        "- The LLM judge of response_check: replaced by the deterministic stand-in above (our `judge_rule` on the "
        "official prompt's own database result and answer), so response_check agreement checks the SQL path, "
        "extraction, reply parsing and threshold only, not a judge.\n"
        "- The official domain servers (Docker images) and gym_dbs.zip (absent from the mirror): the verifiers run "
        "against our server and our seed world; the official task set is not run.\n"
        "- `overall_success` and the verification summary are computed inline in `execute_single_run` (not a "
        "function): here `all(passed)` over the official verifier results, as that code decides it.\n"
        "- The scripted mock LLM and the SmolLM2 agent are not in the verdict table (offline agents only); their runs "
        "are in the compute_score table. No recorded run has an errored episode, so errored-as-failure is checked "
        "by the test (an errored episode scored by both, 5/6 success on both sides), not by these tables.\n"
    )
    return "".join(parts)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--official", type=Path, required=True, help=f"checkout of {REPO}")
    ap.add_argument("--commit", required=True, help=f"its commit (pinned: {COMMIT})")
    ap.add_argument("--scale", default="smoke")
    ap.add_argument("--agents", nargs="+", default=list(AGENTS), choices=AGENTS)
    ap.add_argument("--tasks-per-mode", type=int, default=None, help="the first N tasks of each mode (default all)")
    ap.add_argument(
        "--runs",
        type=Path,
        nargs="+",
        default=[],
        help="runs/ folders of the pipeline (JSONL per agent): compute_score",
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    off = load_official(a.official, a.commit)
    config = load_paper_config("enterpriseops_gym", a.scale)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        sql, by_mode = build(config, Path(tmp))
        tasks = [t for m in config["modes"] for t in by_mode[m][: a.tasks_per_mode]]
        rows = verdict_rows(off, tasks, sql, a.agents, config)
        score_table = None
        if a.runs:
            runs = {f"{run_label(d)}/{p.stem}": stages.read_jsonl(p) for d in a.runs for p in sorted(d.glob("*.jsonl"))}
            score_table = scores(off, runs, Path(tmp) / "scores")
            recorded = {
                (r["agent"], r["run"], r["task_id"], r["mode"]): r["overall_success"]
                for rs in runs.values()
                for r in rs
            }
            seen = [(r["agent"], r["run"], r["task_id"], r["mode"]) for r in rows]
            found = [k for k in seen if k in recorded]
            same = sum(recorded[k] == r["ours"] for k, r in zip(seen, rows) if k in recorded)
    meta = {
        "commit": a.commit,
        "scale": a.scale,
        "tasks": len(tasks),
        "modes": config["modes"],
        "wall_s": time.perf_counter() - t0,
        "runs": ", ".join(f"`{d}`" for d in a.runs),
        "recorded": (len(found), same) if a.runs else None,
    }
    text = report(rows, agreement(rows), score_table, meta)
    a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
