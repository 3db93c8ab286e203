"""A scripted model behind an OpenAI-compatible /v1/chat/completions endpoint on 127.0.0.1 (spec section 7's mock
LLM): it exercises the HTTP path of the ReAct harness without a model.

For a request whose user message is a known task it reads the conversation so far (its own earlier tool calls,
named "call_<step>_<attempt>", and the tool results), resolves the golden plan's symbolic references against those
results and answers with the next tool call, or with the final answer when the plan is done. Two errors are
injected that the harness and the script must recover from: the first request the server ever gets is answered
HTTP 503 (the harness retries), and in every conversation the first attempt at step `bad_step` drops a required
argument (the tool refuses it; the script then sends the correct call).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.tasks import render, resolve


class ScriptedModel:
    def __init__(self, tasks: Sequence[Mapping[str, Any]], bad_step: int | None = 0, http_errors: int = 1):
        self.scripts = {t["user_prompt"]: t["eog"] for t in tasks}
        self.bad_step = bad_step
        self.http_errors = http_errors
        self.lock = threading.Lock()
        self.requests = 0

    def fail_now(self) -> bool:
        with self.lock:
            self.requests += 1
            return self.requests <= self.http_errors

    def reply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        user = next(m["content"] for m in messages if m["role"] == "user")
        script = self.scripts.get(user)
        if script is None:
            return self._message({"role": "assistant", "content": "I cannot do this: I do not know this request."})
        results: dict[int, Any] = {}
        failed: dict[int, int] = {}
        for m in messages:
            if m["role"] != "tool":
                continue
            _, step, attempt = m["tool_call_id"].split("_")
            payload = json.loads(m["content"])
            if isinstance(payload, dict) and "error" in payload:
                failed[int(step)] = int(attempt)
            else:
                results[int(step)] = payload
        plan = script["golden_plan"]
        step = len(results) + 1
        attempt = failed.get(step, -1) + 1
        if step > len(plan) or attempt > 1:
            return self._message({"role": "assistant", "content": render(script["final_answer"], results)})
        args = resolve(plan[step - 1]["args"], results)
        if self.bad_step is not None and step - 1 == self.bad_step and attempt == 0:
            required = T.CATALOGUE[plan[step - 1]["tool"]].parameters["required"]
            args = {k: v for k, v in args.items() if k != (required[0] if required else None)} | {"unexpected": 1}
        call = {
            "id": f"call_{step}_{attempt}",
            "type": "function",
            "function": {"name": plan[step - 1]["tool"], "arguments": json.dumps(args)},
        }
        return self._message({"role": "assistant", "content": None, "tool_calls": [call]}, finish="tool_calls")

    def _message(self, message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
        text = json.dumps(message)
        return {
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": "scripted-mock",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(text) // 4, "total_tokens": len(text) // 4},
        }


class _Handler(BaseHTTPRequestHandler):
    model: ScriptedModel

    def do_POST(self):  # noqa: N802 (the stdlib's name)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        if self.server.model.fail_now():
            return self._send(503, {"error": {"message": "injected: model overloaded"}})
        reply = self.server.model.reply(body)
        prompt = len(json.dumps(body["messages"])) // 4
        reply["usage"]["prompt_tokens"] = prompt
        reply["usage"]["total_tokens"] += prompt
        self._send(200, reply)

    def _send(self, code: int, doc: Mapping[str, Any]):
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Endpoint:
    """The scripted model served on 127.0.0.1 (a free port) in a thread: `with Endpoint(model) as url: ...`."""

    def __init__(self, model: ScriptedModel):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.model = model
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
