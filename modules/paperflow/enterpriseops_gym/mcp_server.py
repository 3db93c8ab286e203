"""The tools over MCP (spec sections 2.2 and 11): one server on 127.0.0.1 built on the `mcp` package's low-level
`Server` with its streamable-HTTP transport at /mcp (initialize, tools/list, tools/call), plus the official
harness's database API beside it:

    POST   /api/seed-database    {database_id, name, description, sql_content}
    DELETE /api/delete-database  {database_id}
    POST   /api/sql-runner       {query, database_id}  -> {"rows": [...]}   (verifiers only; never a tool)

Every MCP request names its database in the x-database-id header and the acting identity in x-user-id, as the
official task "context" does. `McpSession` is the harness's client side, the `mcp` package's own `Client` over
streamable HTTP, run on an event loop of its own so the synchronous harness can call it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any

import httpx2
import uvicorn
from mcp import Client
from mcp import types as mt
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.harness import Session, mcp_content
from paperflow.enterpriseops_gym.sandbox import Template
from paperflow.enterpriseops_gym.tasks import actor_of, visible_tools
from paperflow.enterpriseops_gym.verifiers import sqlite_query


class GymServer:
    """Databases by id, each an episode restored from a seed (templates cached by the seed SQL's hash)."""

    def __init__(self) -> None:
        self.templates: dict[str, Template] = {}
        self.databases: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.mcp = Server(
            "enterpriseops-gym-eog", version="0.1", on_list_tools=self._list_tools, on_call_tool=self._call_tool
        )
        routes = [
            Route("/api/seed-database", self._seed, methods=["POST"]),
            Route("/api/delete-database", self._delete, methods=["DELETE"]),
            Route("/api/sql-runner", self._sql, methods=["POST"]),
        ]
        self.app = self.mcp.streamable_http_app(json_response=True, custom_starlette_routes=routes)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="error", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GymServer:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the MCP server did not start")
            threading.Event().wait(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    # ---- MCP handlers --------------------------------------------------------------------------------------------

    async def _list_tools(self, ctx, params) -> mt.ListToolsResult:
        tools = [
            mt.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in T.CATALOGUE.values()
        ]
        return mt.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx, params) -> mt.CallToolResult:
        headers = ctx.request.headers if ctx.request is not None else {}
        episode = self.databases.get(headers.get("x-database-id", ""))
        if episode is None:
            outcome = {
                "ok": False,
                "error": {"kind": "invalid", "message": "unknown x-database-id; seed a database first"},
            }
        else:
            episode.actor = headers.get("x-user-id", "")
            with self.lock:
                outcome = T.call(episode, params.name, dict(params.arguments or {}))
        result = mcp_content(outcome)
        return mt.CallToolResult(
            content=[mt.TextContent(text=result["content"][0]["text"])], is_error=result["isError"]
        )

    # ---- database API --------------------------------------------------------------------------------------------

    async def _seed(self, request: Request) -> JSONResponse:
        body = await request.json()
        sql = body["sql_content"]
        with self.lock:
            template = self.templates.get(sql)
            if template is None:
                template = self.templates.setdefault(sql, Template(sql))
            self.databases[body["database_id"]] = template.episode(actor="", salt=body.get("salt", body["database_id"]))
        return JSONResponse({"database_id": body["database_id"], "status": "seeded"})

    async def _delete(self, request: Request) -> JSONResponse:
        body = await request.json()
        with self.lock:
            episode = self.databases.pop(body["database_id"], None)
        if episode is None:
            return JSONResponse({"error": f"no database {body['database_id']!r}"}, status_code=404)
        episode.close()
        return JSONResponse({"database_id": body["database_id"], "status": "deleted"})

    async def _sql(self, request: Request) -> JSONResponse:
        body = await request.json()
        episode = self.databases.get(body["database_id"])
        if episode is None:
            return JSONResponse({"error": f"no database {body['database_id']!r}"}, status_code=404)
        with self.lock:
            try:
                rows = sqlite_query(episode.conn)(body["query"])
            except Exception as exc:  # a verifier's SQL error is the caller's to report
                return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse({"rows": rows})


class Loop:
    """An asyncio event loop on a thread of its own: `run(coro)` from synchronous code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client (building one costs ~25 ms; loopback HTTP never uses it)."""
    return ssl.create_default_context()


# One connection per request: on a kept-alive loopback connection, a request sent as two segments waits for the
# server's delayed ACK (~40 ms a request, measured); a fresh connection costs ~1 ms.
CLOSE = {"Connection": "close"}


@functools.cache
def _http() -> httpx2.Client:
    return httpx2.Client(timeout=30, verify=_tls(), headers=CLOSE)


def http_json(method: str, url: str, body: Mapping[str, Any]) -> Any:
    resp = _http().request(method, url, json=dict(body))
    if resp.status_code >= 400:
        raise RuntimeError(f"{method} {url}: HTTP {resp.status_code}: {resp.text}")
    return resp.json()


class McpSession(Session):
    """One episode through the server: seed a database for it, talk MCP with the task's identity headers, run the
    verifiers' SQL through /api/sql-runner, delete the database at the end. The `mcp` client lives in one task on
    the loop (anyio's scopes must open and close in the same task); calls reach it through a queue."""

    def __init__(self, server_url: str, sql: str, task: Mapping[str, Any], loop: Loop, run: int = 0):
        super().__init__(visible_tools(task))
        self.base, self.loop = server_url, loop
        self.database_id = f"{task['task_id']}:{task['eog']['mode']}:{run}"
        seed = {"database_id": self.database_id, "name": task["task_id"], "description": "", "sql_content": sql}
        http_json("POST", f"{self.base}/api/seed-database", seed | {"salt": task["task_id"]})
        self.headers = {"x-database-id": self.database_id, "x-user-id": actor_of(task)}
        self.requests: asyncio.Queue = loop.run(self._queue())
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self.worker = asyncio.run_coroutine_threadsafe(self._serve(ready), loop.loop)
        offered = ready.result(30)
        missing = set(self.names) - offered
        if missing:
            raise RuntimeError(f"the MCP server does not offer {sorted(missing)}")

    async def _queue(self) -> asyncio.Queue:
        return asyncio.Queue()

    async def _serve(self, ready: concurrent.futures.Future) -> None:
        try:
            async with httpx2.AsyncClient(headers=self.headers | CLOSE, timeout=30, verify=_tls()) as http:
                async with Client(
                    streamable_http_client(f"{self.base}/mcp", http_client=http), mode="legacy"
                ) as client:
                    listed = await client.list_tools()
                    ready.set_result({t.name for t in listed.tools})
                    while (item := await self.requests.get()) is not None:
                        (name, args), done = item
                        try:
                            done.set_result(await client.call_tool(name, args))
                        except Exception as exc:
                            done.set_exception(exc)
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    def _call(self, name: str, args: Any) -> dict[str, Any]:
        if not isinstance(args, dict):
            return mcp_content(
                {"ok": False, "error": {"kind": "invalid", "message": "arguments must be a JSON object"}}
            )
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.loop.loop.call_soon_threadsafe(self.requests.put_nowait, ((name, args), done))
        result = done.result(60)
        return {"content": [{"type": "text", "text": c.text} for c in result.content], "isError": bool(result.is_error)}

    def query(self, sql: str) -> list[dict[str, Any]]:
        return http_json("POST", f"{self.base}/api/sql-runner", {"query": sql, "database_id": self.database_id})["rows"]

    def close(self) -> None:
        self.loop.loop.call_soon_threadsafe(self.requests.put_nowait, None)
        self.worker.result(30)
        http_json("DELETE", f"{self.base}/api/delete-database", {"database_id": self.database_id})
