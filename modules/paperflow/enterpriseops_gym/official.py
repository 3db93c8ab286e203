"""EnterpriseOps-Gym at paper scale (`source.kind: official`): the official task set and the official harness's
conventions, with our ReAct client against any OpenAI-compatible endpoint (an API model, or an open model served by
vLLM on the GPU node of the run).

- Data: the Hugging Face dataset ServiceNow-AI/EnterpriseOps-Gym (configs = tool-set modes, splits = domains) at a
  pinned commit, and gym_dbs.zip (the seed SQL of every task database) at a pinned commit of the official repository,
  checked against the git blob id that commit's tree gives and against the sha256 of the lock file.
- Servers: the official domain MCP servers (Docker images, started by the user, `official.servers` names their URLs).
  `OfficialSession` follows benchmark/executor.py and benchmark/mcp_client.py of the official repository: a fresh
  database per server and run (POST /api/seed-database with the task's seed SQL), MCP over HTTP JSON-RPC
  (initialize with protocolVersion 2024-11-05, notifications/initialized, tools/list, tools/call; every request
  carries x-database-id and the task context as x-* headers), tools merged across servers (the first server wins on a
  name clash), filtered to selected_tools minus restricted_tools, the database deleted at the end.
- Verifiers (benchmark/verifier.py): database_state through /api/sql-runner with the official result extraction and
  comparisons, response_check judged by the run's model with the official judge prompt, tool_execution. A verifier
  whose gym_name names no server of the task is skipped, as there. Success = every verifier passes.
- Samples whose run errors (the endpoint or a server failing past its retries) are retried up to `attempts` times, as
  evaluate.py does; an errored episode is counted in tables/counts.csv and scored as a failure in every rate, as
  compute_score.py scores it.
- `vllm_command`: the `vllm serve` command line for an open model (tool-call and reasoning parsers), served inside
  the GPU job by the kit's `paperflow.core.lm.serve.served`.
- `official_tables`: success and verifier pass rates per model, mode and domain as the paper's tables give them
  (the README's "Avg" is the unweighted mean over domains), with micro averages and pass^k beside them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import random
import shlex
import string
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.hub import snapshot_folder
from paperflow.core.lm import serve
from paperflow.enterpriseops_gym.harness import HarnessError, Session, post_json
from paperflow.enterpriseops_gym.stages import read_jsonl, write_jsonl

log = logging.getLogger(__name__)
SLUG = "enterpriseops_gym"

MODES = ("oracle", "plus_5_tools", "plus_10_tools", "plus_15_tools")  # the dataset's configs
DOMAINS = ("calendar", "csm", "drive", "email", "hr", "hybrid", "itsm", "teams")  # its splits
JSON_COLUMNS = ("gym_servers_config", "verifiers")  # JSON text in the dataset, parsed as evaluate.py does
PROTOCOL_VERSION = "2024-11-05"
DB_ROOT = "Domain Wise DBs and Task-DB Mappings"

# benchmark/verifier.py's judge prompt, verbatim: the judge is the run's own model there
JUDGE_SYSTEM = """You are an AI judge evaluating the quality and accuracy of an AI assistant's response.
Compare the database query result with the AI's response and rate how well they match.
Provide a score from 1-10 where:
- 1-3: Poor match, incorrect or missing information
- 4-6: Partial match, some correct information
- 7-8: Good match, mostly correct
- 9-10: Excellent match, fully accurate

Respond with ONLY a JSON object in this format:
{
  "score": <number 1-10>,
  "reasoning": "<brief explanation>"
}"""


# ---- downloads -----------------------------------------------------------------------------------------------------


def split_files(folder: str | Path, mode: str, domain: str) -> list[Path]:
    """The parquet files of config `mode`, split `domain` in a dataset snapshot: the paths the dataset card's
    `configs:` block names, else the layout push_to_hub writes (<config>/<split>-*.parquet)."""
    folder = Path(folder)
    patterns = [f"{mode}/{domain}-*.parquet"]
    card = folder / "README.md"
    if card.is_file():
        patterns = _card_patterns(card.read_text(), mode, domain) or patterns
    files = sorted(p for p in folder.rglob("*.parquet") if any(fnmatch.fnmatch(_rel(p, folder), q) for q in patterns))
    if not files:
        raise FileNotFoundError(
            f"no parquet file of config {mode!r} split {domain!r} in {folder} (looked for {patterns})"
        )
    return files


def _rel(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def _card_patterns(card: str, mode: str, domain: str) -> list[str]:
    import yaml

    if not card.startswith("---"):
        return []
    meta = yaml.safe_load(card.split("---", 2)[1]) or {}
    for config in meta.get("configs") or []:
        if config.get("config_name") != mode:
            continue
        for entry in config.get("data_files") or []:
            if entry.get("split") == domain:
                path = entry["path"]
                return [path] if isinstance(path, str) else list(path)
    return []


def read_rows(folder: str | Path, mode: str, domain: str) -> list[dict[str, Any]]:
    """The task rows of one (mode, domain), JSON columns parsed, the mode beside them."""
    import pyarrow.parquet as pq

    rows = []
    for path in split_files(folder, mode, domain):
        for row in pq.read_table(path).to_pylist():
            for key in JSON_COLUMNS:
                if isinstance(row.get(key), str):
                    row[key] = json.loads(row[key])
            row["restricted_tools"] = list(row.get("restricted_tools") or [])
            rows.append({**row, "mode": mode, "domain": row.get("domain") or domain})
    return rows


def download_tasks(
    dataset: Mapping[str, Any], modes: Sequence[str], domains: Sequence[str], cache: str, outputs: Mapping[str, str]
) -> dict[str, Any]:
    """The dataset's files (`dataset.files`) at the pinned commit into the cache; one JSONL per mode (every domain's
    rows) in `outputs[mode]` and `outputs["meta"]` (JSON: the commit and the rows per mode and domain)."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub = dataset["hub"]
    revision = pinned_revision(hub, dataset["revision"], slug=SLUG, key="source.tasks.revision", repo_type="dataset")
    folder = snapshot_folder(cache, "dataset", hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=list(dataset["files"]), repo_type="dataset")
    counts: dict[str, dict[str, int]] = {}
    for mode in modes:
        rows = [r for d in domains for r in read_rows(folder, mode, d)]
        write_jsonl(outputs[mode], rows)
        counts[mode] = {d: sum(r["domain"] == d for r in rows) for d in domains}
    doc = {"hub": hub, "revision": revision, "folder": str(folder), "rows": counts}
    Path(outputs["meta"]).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def git_blob_sha1(path: str | Path) -> str:
    """The git blob id of a file (sha1 of "blob <size>\\0" + bytes): what a commit's tree names it by."""
    path = Path(path)
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def download_dbs(dbs: Mapping[str, Any], cache: str, out: str) -> dict[str, Any]:
    """gym_dbs.zip at its pinned URL (sha256 from the config or the lock file; `paperflow pin` records it) and
    checked against `dbs.git_blob`, the id the official repository's tree gives it; unzipped into the cache. `out`
    (JSON) names the folder that holds "Domain Wise DBs and Task-DB Mappings"."""
    from paperflow.core.download import pinned_fetch

    folder = Path(cache) / "gym_dbs" / dbs["git_blob"]
    archive = folder.with_suffix(".zip")
    pinned_fetch(dbs["url"], archive, dbs["sha256"], slug=SLUG, key="source.dbs.sha256")
    blob = git_blob_sha1(archive)
    if blob != dbs["git_blob"]:
        archive.unlink()
        raise ConfigError(
            f"source.dbs.git_blob: {dbs['url']} has git blob id {blob}, the official repository's tree names "
            f"{dbs['git_blob']}; the file was deleted"
        )
    with zipfile.ZipFile(archive) as zf:
        sql = [n for n in zf.namelist() if n.endswith(".sql")]
        zf.extractall(folder)
    doc = {"url": dbs["url"], "git_blob": blob, "folder": str(folder), "sql_files": len(sql)}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


# ---- preprocess ----------------------------------------------------------------------------------------------------


def preprocess(tasks_path: str, dbs_json: str, servers: Mapping[str, str], out: str) -> dict[str, int]:
    """The mode's tasks ready to run: every seed_database_file resolved to a file of the unzipped gym_dbs (a missing
    one is an error) and every mcp_server_url replaced by the URL `official.servers` gives its server name."""
    root = Path(json.loads(Path(dbs_json).read_text())["folder"])
    rows = read_jsonl(tasks_path)
    for row in rows:
        for gym in row["gym_servers_config"]:
            name = gym["mcp_server_name"]
            if name not in servers:
                raise ConfigError(
                    f"official.servers has no URL for server {name!r} (task {row['task_id']}); known: {sorted(servers)}"
                )
            gym["mcp_server_url"] = servers[name]
            sql = root / gym["seed_database_file"]
            if not sql.is_file():
                raise FileNotFoundError(
                    f"task {row['task_id']}: seed database {gym['seed_database_file']!r} not in {root}"
                )
            gym["seed_database_file"] = str(sql)
    write_jsonl(out, rows)
    return {"tasks": len(rows), "servers": len({g["mcp_server_name"] for r in rows for g in r["gym_servers_config"]})}


# ---- the official servers ------------------------------------------------------------------------------------------


def context_headers(context: Mapping[str, Any] | None) -> dict[str, str]:
    """A task context as request headers, as mcp_client.py writes them: user_id -> x-user-id; x-* keys as they are."""
    out = {}
    for key, value in (context or {}).items():
        out[key if key.lower().startswith("x-") else f"x-{key.lower().replace('_', '-')}"] = str(value)
    return out


def _http(method: str, url: str, body: Any, headers: Mapping[str, str], timeout: float = 60) -> tuple[int, Any, dict]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, got = resp.read(), resp.status, dict(resp.headers.items())
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read(), exc.code, dict(exc.headers.items())
    text = raw.decode() if raw else ""
    return status, _json_or_sse(text), {k.lower(): v for k, v in got.items()}


def _json_or_sse(text: str) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        return json.loads(data[-1]) if data else text


class McpClient:
    """One domain server over MCP's HTTP JSON-RPC, as benchmark/mcp_client.py talks to it."""

    def __init__(self, base_url: str, database_id: str, context: Mapping[str, Any] | None, endpoint: str = "/mcp"):
        self.base_url, self.endpoint = base_url.rstrip("/"), endpoint
        self.database_id, self.context = database_id, dict(context or {})
        self.session_id: str | None = None
        self.next_id = 1

    def headers(self) -> dict[str, str]:
        h = {"Accept": "application/json, text/event-stream", "x-database-id": self.database_id}
        if self.session_id:
            h["mcp-session-id"] = self.session_id
        return h | context_headers(self.context)

    def rpc(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON-RPC reply document; HTTP failures raise HarnessError (the sample errors and is retried)."""
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": dict(params)}
        status, doc, headers = _http("POST", self.base_url + self.endpoint, body, self.headers())
        self.session_id = headers.get("mcp-session-id", self.session_id)
        if status != 200 or not isinstance(doc, dict):
            raise HarnessError(f"MCP {method} at {self.base_url}: HTTP {status}: {str(doc)[:300]}")
        return doc

    def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        doc = self.rpc(method, params)
        if doc.get("error"):
            raise HarnessError(f"MCP {method} at {self.base_url}: {doc['error']}")
        return doc.get("result") or {}

    def connect(self) -> None:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}},
            "clientInfo": {"name": "paperflow-eog", "version": "1.0.0"},
        }
        self.request("initialize", params)
        note = {"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}}
        _http("POST", self.base_url + self.endpoint, note, self.headers())

    def list_tools(self) -> list[dict[str, Any]]:
        return list(self.request("tools/list", {}).get("tools", []))

    def call_tool(self, name: str, args: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Any]:
        """(the tools/call result, the JSON-RPC error): a JSON-RPC error is the tool's failure, not the sample's."""
        doc = self.rpc("tools/call", {"name": name, "arguments": dict(args)})
        return doc.get("result"), doc.get("error")

    def sql(self, query: str) -> dict[str, Any]:
        """/api/sql-runner (verifiers only): {"success": True, "result": <reply>} or {"success": False, "error"}."""
        body = {"query": query, "database_id": self.database_id}
        headers = {"x-database-id": self.database_id} | context_headers(self.context)
        status, doc, _ = _http("POST", self.base_url + "/api/sql-runner", body, headers)
        if status >= 400:
            return {"success": False, "error": f"SQL API call failed (HTTP {status}): {doc}"}
        return {"success": True, "result": doc}


def _tool_error(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps({"error": message})}], "isError": True}


def new_database_id() -> str:
    """mcp_client.py's form: db_<ms>_<9 random lowercase letters and digits>."""
    suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=9))
    return f"db_{int(time.time() * 1000)}_{suffix}"


class OfficialSession(Session):
    """One episode of an official task on the official servers (or any server with their protocol)."""

    def __init__(self, task: Mapping[str, Any]):
        super().__init__([])
        self.task = task
        self.clients: dict[str, McpClient] = {}
        self.tools: dict[str, dict[str, Any]] = {}
        self.route: dict[str, str] = {}
        try:
            for gym in task["gym_servers_config"]:
                url, db = gym["mcp_server_url"].rstrip("/"), new_database_id()
                sql = Path(gym["seed_database_file"]).read_text(encoding="utf-8")
                seed = {"database_id": db, "name": f"eog {task['task_id']}", "description": "", "sql_content": sql}
                status, doc, _ = _http("POST", url + "/api/seed-database", seed, {}, timeout=1200)
                if status >= 400:
                    raise HarnessError(f"seed-database at {url}: HTTP {status}: {str(doc)[:300]}")
                client = McpClient(url, db, gym.get("context"), task.get("mcp_endpoint") or "/mcp")
                self.clients[gym["mcp_server_name"]] = client
                client.connect()
                for tool in client.list_tools():
                    if tool["name"] not in self.route:  # the first server wins, as in executor.py
                        self.route[tool["name"]] = gym["mcp_server_name"]
                        self.tools[tool["name"]] = tool
        except Exception:
            self.close()
            raise
        selected, restricted = task.get("selected_tools") or [], set(task.get("restricted_tools") or [])
        names = [n for n in self.tools if n in selected] if selected else list(self.tools)
        self.names = [n for n in names if n not in restricted]
        self.missing = sorted(set(selected) - set(self.tools))

    def specs(self) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "function": {
                    "name": n,
                    "description": self.tools[n].get("description") or "",
                    "parameters": self.tools[n].get("inputSchema") or {"type": "object", "properties": {}},
                },
            }
            for n in self.names
        ]

    def call(self, name: str, args: Any) -> dict[str, Any]:
        """A tool call routed to its server. The text the model reads is what react.py's ToolMessage carries: the
        JSON of the tools/call result ({"content": [...], "isError": ...}; `null` after a JSON-RPC error)."""
        error = None
        if name not in self.names:
            raw = _tool_error(f"tool {name!r} is not available")
        elif not isinstance(args, dict):
            raw = _tool_error("arguments must be a JSON object")
        else:
            raw, error = self.clients[self.route[name]].call_tool(name, args)
        ok = isinstance(raw, dict) and not raw.get("isError", False)
        self.calls.append({"tool": name, "args": args, "ok": ok, "writes": None})
        return {"content": [{"type": "text", "text": json.dumps(raw)}], "isError": not ok, "error": error}

    def client_for(self, gym_name: str | None) -> McpClient | None:
        if gym_name:
            return self.clients.get(gym_name)
        return next(iter(self.clients.values()), None)

    def close(self) -> None:
        for client in self.clients.values():
            try:
                _http("DELETE", client.base_url + "/api/delete-database", {"database_id": client.database_id}, {})
            except (urllib.error.URLError, OSError) as exc:  # a server gone at the end does not undo the episode
                log.warning("delete-database at %s failed: %s", client.base_url, exc)
        self.clients = {}


# ---- verifiers (benchmark/verifier.py) -----------------------------------------------------------------------------


def extract_value(result: Mapping[str, Any]) -> Any:
    """verifier.py's _extract_value_from_sql_result: the sql-runner reply's `data` or `rows` by shape (1 x 1 ->
    scalar, one row -> the row, otherwise the list), its MCP error text, its nested `result`, or the reply."""
    if not result or not result.get("success"):
        return None
    data = result.get("result", {})
    if not isinstance(data, dict):
        return data
    for key in ("data", "rows"):
        if key in data:
            rows = data[key]
            if isinstance(rows, list) and rows:
                first = rows[0]
                if len(rows) == 1 and isinstance(first, dict) and len(first) == 1:
                    return next(iter(first.values()))
                if len(rows) == 1 and isinstance(first, list) and len(first) == 1 and key == "rows":
                    return first[0]
                return first if len(rows) == 1 else rows
            return rows
    if "content" in data:
        content = data["content"]
        for item in content if isinstance(content, list) else []:
            if isinstance(item, dict) and item.get("type") == "text":
                return item.get("text", data)
        return content
    if "result" in data:
        return data["result"]
    return data


def compare_values(actual: Any, expected: Any, comparison_type: str) -> bool:
    """verifier.py's _compare_values: plain Python comparisons; one that raises fails."""
    try:
        if comparison_type == "equals":
            return bool(actual == expected)
        if comparison_type == "greater_than":
            return bool(actual > expected)
        if comparison_type == "less_than":
            return bool(actual < expected)
        if comparison_type == "contains":
            return expected in str(actual)
    except TypeError:
        return False
    return False


class LlmJudge:
    """response_check's judge: a model behind an OpenAI-compatible endpoint (the run's own model, as in the official
    harness, unless `official.judge` names another) asked with verifier.py's prompt for a JSON score."""

    def __init__(self, base_url: str, model: str, api_key: str = "none", retries: int = 5, max_tokens: int = 4096):
        self.base_url, self.model, self.api_key, self.retries = base_url, model, api_key, retries
        self.max_tokens = max_tokens

    def judge(self, sql_result: Mapping[str, Any], response: str, prompt: str, minimum: float) -> dict[str, Any]:
        shown = json.dumps(sql_result.get("result", {}), indent=2)
        user = (
            f"Database Query Result:\n{shown}\n\nAI Assistant Response:\n{response}\n\n"
            f"Comparison Task:\n{prompt}\n\nPlease provide your judgment as JSON."
        )
        body = {
            "model": self.model,
            "messages": [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}],
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
        }
        reply, _ = post_json(self.base_url.rstrip("/") + "/chat/completions", body, self.retries, api_key=self.api_key)
        text = reply["choices"][0]["message"].get("content") or ""
        if "```json" in text:
            text = text.split("```json")[1].split("```")[0].strip()
        elif "```" in text:
            text = text.split("```")[1].split("```")[0].strip()
        try:
            score = json.loads(text).get("score", 0)
        except (json.JSONDecodeError, AttributeError) as exc:
            return {"passed": False, "error": f"Judge comparison failed: {exc}", "judge_text": text[:500]}
        return {"passed": score >= minimum, "score": score, "minimum_score": minimum}


def verify_official(
    verifiers: Sequence[Mapping[str, Any]], session: OfficialSession, response: str, judge: LlmJudge | None
) -> dict[str, Any]:
    """The verification of one run, as executor.py's _run_verifiers and verifier.py compute it."""
    results = {}
    skipped = []
    called = [c["tool"] for c in session.calls]
    for i, v in enumerate(verifiers):
        name = v.get("name") or f"verifier_{i + 1}"
        kind, cfg = v.get("verifier_type"), v.get("validation_config") or {}
        client = session.client_for(v.get("gym_name"))
        if v.get("gym_name") and client is None:
            skipped.append(name)  # executor.py skips a verifier whose gym is not in the task
            continue
        if kind == "database_state":
            sql = client.sql(cfg["query"])
            if not sql["success"]:
                results[name] = {"passed": False, "type": kind, "error": sql["error"]}
                continue
            actual = extract_value(sql)
            ok = compare_values(actual, cfg.get("expected_value"), cfg.get("comparison_type", "equals"))
            results[name] = {"passed": ok, "type": kind, "actual": actual, "expected": cfg.get("expected_value")}
        elif kind == "response_check":
            sql = client.sql(cfg["sql_query"])
            if not sql["success"]:
                results[name] = {"passed": False, "type": kind, "error": sql["error"]}
            elif judge is None:
                raise ConfigError("a response_check verifier needs a judge (official.judge)")
            else:
                minimum = cfg.get("minimum_comparison_value", 7)
                results[name] = {"type": kind} | judge.judge(sql, response, cfg["comparison_prompt"], minimum)
        elif kind == "tool_execution":
            wanted = list(cfg.get("selected_tools", []))
            missing = [t for t in wanted if t not in called]
            ok = not missing and len(called) >= cfg.get("minimum_tool_calls", 1)
            results[name] = {"passed": ok, "type": kind, "missing_tools": missing}
        else:
            results[name] = {"passed": False, "type": kind, "error": f"Unsupported verifier type: {kind}"}
    passed = sum(r["passed"] for r in results.values())
    total = len(results)
    return {
        "results": results,
        "skipped": skipped,
        "total": total,
        "passed": passed,
        "failed": total - passed,
        "pass_rate": passed / total if total else 0.0,
        "overall_success": passed == total,
    }


# ---- episodes ------------------------------------------------------------------------------------------------------


def run_official_episode(
    task: Mapping[str, Any],
    agent: Any,
    judge: LlmJudge | None,
    run: int,
    attempts: int = 5,
    open_session: Callable[[Mapping[str, Any]], OfficialSession] = OfficialSession,
) -> dict[str, Any]:
    """One run of one task: a fresh database on every server of the task, the agent, the verifiers; a run that errors
    is repeated up to `attempts` times (evaluate.py's max_num_attempts), the last error kept if none succeeds."""
    error = None
    for attempt in range(1, attempts + 1):
        t0 = time.perf_counter()
        session = None
        try:
            session = open_session(task)
            response, flow = agent.act(task, session)
            summary = verify_official(task.get("verifiers") or [], session, response, judge)
        except (HarnessError, urllib.error.URLError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("task %s run %d attempt %d errored: %s", task["task_id"], run, attempt, error)
            continue
        finally:
            if session is not None:
                session.close()
        calls = session.calls
        return {
            "task_id": task["task_id"],
            "domain": task["domain"],
            "mode": task["mode"],
            "agent": agent.name,
            "run": run,
            "attempts": attempt,
            "errored": None,
            "overall_success": summary["overall_success"],
            "verifiers_total": summary["total"],
            "verifiers_passed": summary["passed"],
            "verifier_pass_rate": summary["pass_rate"],
            "verifiers_skipped": len(summary["skipped"]),
            "tools_offered": len(session.names),
            "tools_missing": session.missing,
            "tool_calls": len(calls),
            "failed_calls": sum(not c["ok"] for c in calls),
            "response": response,
            "wall_ms": round(1000 * (time.perf_counter() - t0), 2),
            "verification_summary": summary,
            "conversation_flow": flow,
        }
    return {
        "task_id": task["task_id"],
        "domain": task["domain"],
        "mode": task["mode"],
        "agent": agent.name,
        "run": run,
        "attempts": attempts,
        "errored": error,
        "overall_success": False,
        "verifiers_total": len(task.get("verifiers") or []),
        "verifiers_passed": 0,
        "verifier_pass_rate": 0.0,
        "verifiers_skipped": 0,
        "tools_offered": 0,
        "tools_missing": [],
        "tool_calls": 0,
        "failed_calls": 0,
        "response": "",
        "wall_ms": 0.0,
        "verification_summary": None,
        "conversation_flow": [],
    }


def run_official(
    tasks: Sequence[Mapping[str, Any]],
    agent: Any,
    judge: LlmJudge | None,
    runs: int,
    attempts: int = 5,
    journal: str | Path | None = None,
    **kw,
) -> list[dict[str, Any]]:
    """`runs` runs (evaluate.py's --num_runs) of every task, each task's number_of_runs within a run. Each episode's
    record goes to the `journal` (the job's checkpoint folder) as it finishes, and a rerun skips the episodes there;
    records come back with their keys in sorted order, whether journalled or not."""
    from paperflow.core.resume import row_journal

    ids = []
    with row_journal(journal) as done:
        for r in range(runs):
            for task in tasks:
                for i in range(int(task.get("number_of_runs") or 1)):
                    run = r * int(task.get("number_of_runs") or 1) + i
                    key = f"{task['task_id']}:{run}"
                    ids.append(key)
                    if key not in done:
                        done.append({**run_official_episode(task, agent, judge, run, attempts, **kw), "id": key})
        rows = done.complete(ids)
    return [{k: row[k] for k in sorted(row) if k != "id"} for row in rows]


# ---- the model endpoint --------------------------------------------------------------------------------------------


def vllm_command(folder: str, served_name: str, port: int, gpus: int, model: Mapping[str, Any]) -> list[str]:
    """`vllm serve` for an open model downloaded at its pinned commit: the OpenAI-compatible server on 127.0.0.1
    with tool calls parsed (`tool_call_parser`), the reasoning parser where the model has one, tensor parallel over
    the job's GPUs, prefix caching (the tasks share long system prompts) and `vllm_args` appended."""
    extra = ["--enable-prefix-caching", "--enable-auto-tool-choice", "--tool-call-parser", model["tool_call_parser"]]
    if model.get("reasoning_parser"):
        extra += ["--reasoning-parser", model["reasoning_parser"]]
    return serve.vllm_command(
        folder,
        served_name,
        port=port,
        tensor_parallel_size=gpus,
        max_model_len=model.get("max_model_len") or None,
        generation_config=None,
        extra=[*extra, *(model.get("vllm_args") or [])],
    )


def endpoint_of(name: str, model: Mapping[str, Any]) -> tuple[str, str]:
    """(base URL, API key) of an API model: `base_url`, and the key from the environment variable `api_key_env`."""
    key = os.environ.get(model["api_key_env"], "") if model.get("api_key_env") else "none"
    if model.get("api_key_env") and not key:
        raise ConfigError(
            f"official.models.{name}.api_key_env: the environment variable {model['api_key_env']} is not set"
        )
    return model["base_url"], key


# ---- tables --------------------------------------------------------------------------------------------------------


def official_tables(episodes, domains: Sequence[str]):
    """(success, verifier_pass, counts, pass_k) frames from the episode table: per model and mode, one column per
    domain (percent, over every episode, an errored one a failure), `avg` the unweighted mean over the domains present (the README's
    Avg), `micro` over all episodes; counts give episodes and errored ones; pass^k per model, mode and domain."""
    import pandas as pd

    from paperflow.enterpriseops_gym.metrics import as_failures, pass_hat_k

    ok = as_failures(episodes)
    tables = {}
    for metric, column in (("success", "overall_success"), ("verifier_pass", "verifier_pass_rate")):
        rows = []
        for (agent, mode), g in ok.groupby(["agent", "mode"], sort=True):
            per = {d: 100.0 * float(g[g["domain"] == d][column].mean()) for d in domains if (g["domain"] == d).any()}
            rows.append(
                {
                    "model": agent,
                    "mode": mode,
                    **per,
                    "avg": sum(per.values()) / len(per),
                    "micro": 100.0 * float(g[column].mean()),
                }
            )
        tables[metric] = pd.DataFrame(rows, columns=["model", "mode", *domains, "avg", "micro"])
    counts = (
        episodes.assign(errored=episodes["errored"].notna())
        .groupby(["agent", "mode", "domain"], sort=True)
        .agg(episodes=("task_id", "size"), errored=("errored", "sum"), tasks=("task_id", "nunique"))
        .reset_index()
        .rename(columns={"agent": "model"})
    )
    rows = []
    for (agent, mode, domain), g in ok.groupby(["agent", "mode", "domain"], sort=True):
        per_task = g.groupby("task_id")["overall_success"].agg(["sum", "count"])
        n = int(per_task["count"].min())
        for k in range(1, n + 1):
            values = [pass_hat_k(int(c), int(m), k) for c, m in zip(per_task["sum"], per_task["count"])]
            rows.append(
                {
                    "model": agent,
                    "mode": mode,
                    "domain": domain,
                    "k": k,
                    "n": n,
                    "pass_hat_k": sum(values) / len(values),
                }
            )
    tables["pass_k"] = pd.DataFrame(rows, columns=["model", "mode", "domain", "k", "n", "pass_hat_k"])
    tables["counts"] = counts
    return tables


# ---- the stages' entry points --------------------------------------------------------------------------------------


def run_model(
    name: str,
    model: Mapping[str, Any],
    task_paths: Mapping[str, str],
    official: Mapping[str, Any],
    model_json: str | None = None,
    server_log: str | None = None,
    servers_log_dir: str | None = None,
    journal: str | Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every official task of every mode with model `name` under the ReAct harness: an open model (`serve: vllm`) is
    served by vLLM on this job's GPUs for the run's length, an API model is reached at its `base_url`. The judge of
    response checks is the same model (the official convention) unless `official.judge` names another endpoint.
    The domain servers the tasks name run under Apptainer for the run's length (`containers.domain_servers`, logs in
    `servers_log_dir`) when `official.containers.start` is set; their pins are checked before the model server starts.
    Finished episodes go to `journal` (run_official), so a rerun of a killed job runs only the rest."""
    from paperflow.enterpriseops_gym import containers
    from paperflow.enterpriseops_gym.harness import ReactAgent

    h = official["harness"]
    tasks = [t for mode in official["modes"] for t in read_jsonl(task_paths[mode])]
    needed = containers.needed_servers(tasks)
    boxes = official.get("containers") or {}
    if boxes.get("start"):
        containers.commands(boxes, needed)  # an unpinned image is refused before anything starts
    logs_dir = servers_log_dir or str(Path(server_log or "logs").with_suffix("")) + "_servers"

    def run(base_url: str, api_key: str, served: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        agent = ReactAgent(
            base_url,
            served,
            temperature=float(model.get("temperature", h["temperature"])),
            max_tokens=int(model.get("max_tokens", h["max_tokens"])),
            max_iterations=int(h["max_iterations"]),
            retries=int(h["retries"]),
            name=name,
            api_key=api_key,
        )
        judge_cfg = official.get("judge") or {}
        if judge_cfg.get("base_url"):
            jurl, jkey = endpoint_of("judge", judge_cfg)
            judge = LlmJudge(jurl, judge_cfg["model"], jkey, retries=int(h["retries"]))
        else:
            judge = LlmJudge(base_url, served, api_key, retries=int(h["retries"]))
        with containers.domain_servers(boxes, official["servers"], needed, logs_dir) as started:
            records = run_official(tasks, agent, judge, int(official["runs"]), int(h["attempts"]), journal=journal)
        notes = {"model": name, "served_as": served, "usage": dict(agent.usage), "tasks": len(tasks)}
        return records, notes | {"domain_servers": {s: shlex.join(c) for s, c in started.items()}}

    if model["serve"] == "vllm":
        from paperflow.core.device import pick

        device = pick(model.get("device", "cuda"), key=f"official.models.{name}.device")
        if device.type != "cuda":
            raise ConfigError(f"official.models.{name}: vLLM serves on CUDA GPUs; the job sees {device}")
        import torch

        folder = json.loads(Path(model_json).read_text())["folder"]
        port = int(model.get("port", 8000))
        command = vllm_command(folder, name, port, torch.cuda.device_count(), model)
        base_url = f"http://127.0.0.1:{port}/v1"
        timeout_s = float(model.get("startup_timeout_s", 1800))
        with serve.served(command, base_url, served_name=name, timeout_s=timeout_s, log_path=server_log):
            records, notes = run(base_url, "none", name)
        return records, notes | {"vllm_command": command}
    if model["serve"] == "api":
        base_url, key = endpoint_of(name, model)
        return run(base_url, key, model["model"])
    raise ConfigError(f"official.models.{name}.serve = {model['serve']!r} not in vllm, api")


EPISODE_COLUMNS = (
    "task_id",
    "domain",
    "mode",
    "agent",
    "run",
    "attempts",
    "errored",
    "overall_success",
    "verifiers_total",
    "verifiers_passed",
    "verifier_pass_rate",
    "verifiers_skipped",
    "tools_offered",
    "tool_calls",
    "failed_calls",
    "wall_ms",
)


def episode_table(paths: Mapping[str, str]):
    """Every model's episodes as one table (the conversations stay in the JSONL traces)."""
    import pandas as pd

    rows = [{k: r[k] for k in EPISODE_COLUMNS} for path in paths.values() for r in read_jsonl(path)]
    frame = pd.DataFrame(rows, columns=list(EPISODE_COLUMNS))
    frame["errored"] = frame["errored"].astype(object).where(frame["errored"].notna(), None)
    return frame


def report(episodes, domains: Sequence[str], meta: Mapping[str, Any], outputs: Mapping[str, str]) -> dict[str, Any]:
    """The paper-scale tables (CSV), metrics.json and report.md: success per model, mode and domain as in the
    paper's tables, the verifier pass rate, pass^k and the episode counts with the errored ones."""
    tables = official_tables(episodes, domains)
    for key in ("success", "verifier_pass", "pass_k", "counts"):
        tables[key].to_csv(outputs[f"table_{key}"], index=False)
    metrics = {
        "dataset": {"hub": meta["hub"], "revision": meta["revision"], "rows": meta["rows"]},
        "episodes": int(len(episodes)),
        "errored": int(episodes["errored"].notna().sum()),
        "success": tables["success"].to_dict(orient="records"),
        "verifier_pass": tables["verifier_pass"].to_dict(orient="records"),
    }
    Path(outputs["metrics"]).write_text(json.dumps(metrics, indent=1, default=float) + "\n")
    lines = [
        "# EnterpriseOps-Gym at paper scale",
        "",
        f"Official task set {meta['hub']} at commit {meta['revision']}; {len(episodes)} episodes, "
        f"{metrics['errored']} errored (scored as failures, as compute_score.py does; counted in tables/counts.csv).",
        "",
        "## Task success (%) per domain, ReAct",
        "",
        _markdown(tables["success"]),
        "",
        "## Verifier pass rate (%)",
        "",
        _markdown(tables["verifier_pass"]),
        "",
    ]
    Path(outputs["report"]).write_text("\n".join(lines))
    return metrics


def _markdown(frame) -> str:
    cols = list(frame.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        out.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row) + " |")
    return "\n".join(out)
