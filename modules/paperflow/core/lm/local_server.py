"""The kit's own small OpenAI-compatible server: a transformers model served from inside the job, on 127.0.0.1, so
that code written for a vLLM server (the kit's `serve.Client` and the papers' `complete_each` / `chat_each`) runs
unchanged at smoke and cpu scale against a tiny or small model on the CPU.

    with LocalServer(model, tokenizer, "q") as server:
        client = server.client(concurrency=64)
        choices = client.complete("<bos> <c> a b <x>", n=8, temperature=1.0, max_tokens=12, seed=3)

Why not `transformers serve` (transformers 5.24, read in its cli/serving code): it loads a model by id from disk,
not a model object in memory (the tiny models of smoke scale are trained in the job); its /v1/completions takes a
text prompt only and accepts `n` without implementing it (`UNUSED_LEGACY_COMPLETION_FIELDS`); a request's `seed`
reseeds the process-wide torch generator, so concurrent requests share one stream; and it needs fastapi and
uvicorn, which the envs do not carry. vLLM does not run on this CPU.

What it serves:
- `GET /v1/models`: the one served name.
- `POST /v1/completions`: `prompt` (text, tokenized with `add_special_tokens` (default true, as vLLM), or a
  list of token ids), `n`, `temperature` (0: greedy), `top_k` (-1 or 0: off), `top_p` (only 1.0),
  `max_tokens`, `seed`, `stop` (strings; the text is cut before the first one, as vLLM, finish_reason "stop"),
  `stop_token_ids`. The model's EOS ends a sample (finish_reason "stop"); `max_tokens` reached: "length".
- `POST /v1/chat/completions`: `messages` through the tokenizer's chat template with the generation prompt;
  the same sampling parameters; the choice carries {"message": {"role": "assistant", "content": text}}.
  With `tools` (OpenAI function tools; `tool_choice` absent or "auto"), as vLLM's hermes tool parser: a template
  that renders tools itself gets them as `tools=`; one that does not (SmolLM2's) gets them in the system message as
  a <tools> block of JSON schemas with the instruction to answer <tool_call>{"name": ..., "arguments": {...}}
  </tool_call>, and the conversation's assistant tool calls and `tool` results are written back as that text
  (results as <tool_response> blocks in a user turn). Every well-formed <tool_call> block of a generated text
  becomes an OpenAI tool call (id, type "function", name, arguments as a JSON string), the rest stays the content,
  and finish_reason is "tool_calls"; a malformed block (not JSON, no name, arguments not an object, unclosed) stays
  in the content as text.
A body the server cannot honour (an unknown model, a key it does not implement, a bad value) is answered 400 or
404 with one line naming the key, never silently ignored.

Sampling is the kit's `sampling.sample` (KV-cached, inverse-CDF draws). Requests that arrive together are run as
one batch (those of equal temperature, top_k and stop ids together); each request draws its uniforms from its own generator, seeded by its `seed` (or by the server's
stream when it has none), so a request's samples do not depend on which requests share its batch, up to the
floating-point rounding of a differently padded batch (tested equal on the tiny models).
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

from paperflow.core.lm.sampling import RowStreams, sample
from paperflow.core.lm.serve import Client

log = logging.getLogger(__name__)

KNOWN_KEYS = {
    "model",
    "prompt",
    "messages",
    "n",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "stop",
    "stop_token_ids",
    "add_special_tokens",
    "stream",
    "tools",
    "tool_choice",
}

TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOLS_PREAMBLE = (
    "# Tools\n\nYou can call the functions below to act on the user's request. Their signatures (JSON schemas) "
    "are inside <tools></tools>:\n<tools>\n"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nTo call a function, answer with a JSON object naming it and giving its arguments, inside "
    '<tool_call></tool_call> tags:\n<tool_call>\n{"name": <function name>, "arguments": <arguments as a JSON '
    "object>}\n</tool_call>\nWhen no call is needed, answer in plain text."
)


def tools_system_text(tools: Sequence[Mapping[str, Any]]) -> str:
    """The tools as the system message's <tools> block (for a chat template that does not render tools)."""
    return TOOLS_PREAMBLE + "\n".join(json.dumps(t, sort_keys=False) for t in tools) + TOOLS_POSTAMBLE


def tool_call_text(call: Mapping[str, Any]) -> str:
    """One OpenAI tool call (arguments a JSON string, or an object) as a <tool_call> block."""
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # written back as the model sent it: the conversation shows what it said
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>"


def messages_with_tools(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """`messages` as plain {role, content} text turns for a template without tool support: the tools' block added
    to the system message (one inserted first when there is none), an assistant turn's tool calls appended to its
    text as <tool_call> blocks, and each run of `tool` messages as one user turn of <tool_response> blocks."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        text = content if isinstance(content, str) else ""
        if role == "assistant" and m.get("tool_calls"):
            blocks = [tool_call_text(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(([text] if text else []) + blocks)})
        elif role == "tool":
            block = f"<tool_response>\n{text}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
        else:
            out.append({"role": role, "content": text})
    out = [{k: v for k, v in m.items() if k != "_tool"} for m in out]
    if tools:
        block = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": (out[0]["content"] + "\n\n" + block).lstrip()}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def parse_tool_calls(text: str, ids: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a generated text: each well-formed <tool_call> block (JSON with a string "name" and
    an object "arguments", absent arguments read as {}) becomes an OpenAI tool call with the next id of `ids`; the
    text outside them, malformed blocks included, is the content (None when empty)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    at = 0
    for match in TOOL_CALL.finditer(text):
        try:
            doc = json.loads(match.group(1).strip())
        except json.JSONDecodeError:
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) or not doc["name"]:
            continue
        args = doc.get("arguments", {})
        if not isinstance(args, dict):
            continue
        kept.append(text[at : match.start()])
        at = match.end()
        calls.append(
            {
                "id": f"call_{next(ids)}",
                "type": "function",
                "function": {"name": doc["name"], "arguments": json.dumps(args)},
            }
        )
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def _check_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto"):
        raise BadRequest(f"tool_choice: the kit's local server lets the model choose; allowed: 'auto', got {choice!r}")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and t.get("type") == "function"
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise BadRequest("tools: expected a list of {type: 'function', function: {name, description, parameters}}")
    return tools


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # the socket's backlog: a client's many concurrent requests are not reset


class BadRequest(ValueError):
    """A request body the server cannot honour; its message is one line naming the key."""


@dataclass
class _Job:
    ids: list[int]
    n: int
    temperature: float
    top_k: int | None
    max_tokens: int
    seed: int
    stop: list[str]
    stop_ids: list[int]
    tools: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    result: list[dict[str, Any]] | None = None
    error: BaseException | None = None


def _number(body: Mapping[str, Any], key: str, default, kind, low=None):
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key}: expected a number, got {value!r}")
    value = kind(value)
    if low is not None and value < low:
        raise BadRequest(f"{key}: must be >= {low}, got {value}")
    return value


class LocalServer:
    """`model` (a transformers causal LM, evaluated in place) and `tokenizer` served as `name` at `url` (…/v1) for
    the `with` block. `max_batch_rows` caps the rows of one batch; `batch_window_s` is how long the scheduler
    waits for more requests once one has arrived."""

    def __init__(
        self,
        model,
        tokenizer,
        name: str,
        *,
        max_batch_rows: int = 4096,
        batch_window_s: float = 0.002,
        max_model_len: int | None = None,
        seed: int = 0,
    ):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.max_batch_rows = int(max_batch_rows)
        self.batch_window_s = float(batch_window_s)
        self.max_model_len = int(max_model_len or getattr(model.config, "max_position_embeddings", 1 << 30))
        self._seeds = torch.Generator().manual_seed(int(seed))
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.batches = 0
        self._call_ids = itertools.count()
        self._native_tools: bool | None = None

    # --- the HTTP side -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not running (use it as a context manager)")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def client(self, **kwargs: Any) -> Client:
        """A kit Client of this server (kwargs as Client's: concurrency, timeout_s, retries, ...)."""
        return Client(self.url, self.name, **{"retries": 0, "backoff_s": 0.1, **kwargs})

    def __enter__(self) -> LocalServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, doc: Mapping[str, Any]):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 (the stdlib's name)
                if self.path.rstrip("/") != "/v1/models":
                    return self._send(404, {"error": {"message": f"no route GET {self.path}"}})
                self._send(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})

            def do_POST(self):  # noqa: N802
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    code, doc = server.answer(self.path, body)
                except json.JSONDecodeError as error:
                    code, doc = 400, {"error": {"message": f"the body is not JSON: {error}"}}
                self._send(code, doc)

        self._server = _HTTPServer(("127.0.0.1", 0), Handler)
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="local-server-http", daemon=True),
            threading.Thread(target=self._schedule, name="local-server-model", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._queue.put(None)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=30)
        self._server = None

    def answer(self, path: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON reply) for a POST to `path`."""
        route = path.rstrip("/")
        if route not in ("/v1/completions", "/v1/chat/completions"):
            return 404, {"error": {"message": f"no route POST {path}"}}
        if body.get("model") != self.name:
            return 404, {
                "error": {"message": f"model {body.get('model')!r} is not served here (serving {self.name!r})"}
            }
        try:
            job = self._job(route, body)
        except BadRequest as error:
            return 400, {"error": {"message": str(error)}}
        self._queue.put(job)
        job.done.wait()
        if job.error is not None:
            return 500, {"error": {"message": f"{type(job.error).__name__}: {job.error}"}}
        chat = route.endswith("chat/completions")
        choices = [
            self._chat_choice(i, c, job.tools)
            if chat
            else {"index": i, "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": None}
            for i, c in enumerate(job.result or [])
        ]
        return 200, {
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {"prompt_tokens": len(job.ids), "completion_tokens": sum(c["tokens"] for c in job.result or [])},
        }

    def _chat_choice(self, index: int, c: Mapping[str, Any], tools: bool) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": c["text"]}
        finish = c["finish_reason"]
        if tools:
            content, calls = parse_tool_calls(c["text"], self._call_ids)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                finish = "tool_calls"
        return {"index": index, "message": message, "finish_reason": finish}

    def renders_tools(self) -> bool:
        """Whether the tokenizer's chat template renders a `tools=` list itself (checked once, on a probe)."""
        if self._native_tools is None:
            probe = [{"role": "user", "content": "hi"}]
            tool = {"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}
            plain = self.tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
            with_tools = self.tokenizer.apply_chat_template(
                probe, tools=[tool], tokenize=False, add_generation_prompt=True
            )
            self._native_tools = plain != with_tools
        return self._native_tools

    def chat_ids(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """The prompt's token ids: `messages` (and `tools`) through the chat template with the generation prompt."""
        uses_tools = bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
        if not uses_tools:
            ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        elif self.renders_tools():
            ids = self.tokenizer.apply_chat_template(
                list(messages), tools=list(tools or []) or None, add_generation_prompt=True, tokenize=True
            )
        else:
            ids = self.tokenizer.apply_chat_template(
                messages_with_tools(messages, tools), add_generation_prompt=True, tokenize=True
            )
        return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)

    def _job(self, route: str, body: Mapping[str, Any]) -> _Job:
        unknown = sorted(set(body) - KNOWN_KEYS)
        if unknown:
            raise BadRequest(f"{unknown[0]}: not implemented by the kit's local server; allowed: {sorted(KNOWN_KEYS)}")
        if body.get("stream"):
            raise BadRequest("stream: not implemented by the kit's local server; allowed: false")
        top_p = _number(body, "top_p", 1.0, float)
        if top_p != 1.0:
            raise BadRequest(f"top_p: the kit's local server samples the full law only; allowed: 1.0, got {top_p}")
        tools = None
        if route.endswith("chat/completions"):
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise BadRequest("messages: expected a non-empty list of {role, content}")
            tools = _check_tools(body)
            ids = self.chat_ids(messages, tools)
        else:
            for key in ("tools", "tool_choice"):
                if key in body:
                    raise BadRequest(f"{key}: only /v1/chat/completions takes tools")
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                add = body.get("add_special_tokens", True)
                ids = self.tokenizer(prompt, add_special_tokens=bool(add))["input_ids"]
            elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                ids = list(prompt)
            else:
                raise BadRequest("prompt: expected one text or one list of token ids (batched prompts not served)")
        ids = [int(t) for t in ids]
        if not ids:
            raise BadRequest("prompt: empty after tokenization")
        max_tokens = _number(body, "max_tokens", 16, int, low=0)
        if len(ids) + max_tokens > self.max_model_len:
            raise BadRequest(
                f"max_tokens: prompt ({len(ids)}) + max_tokens ({max_tokens}) exceeds max_model_len {self.max_model_len}"
            )
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise BadRequest(f"stop: expected non-empty strings, got {stop!r}")
        stop_ids = body.get("stop_token_ids") or []
        if not all(isinstance(t, int) for t in stop_ids):
            raise BadRequest(f"stop_token_ids: expected token ids, got {stop_ids!r}")
        top_k = _number(body, "top_k", -1, int, low=-1)
        seed = body.get("seed")
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise BadRequest(f"seed: expected an integer, got {seed!r}")
        return _Job(
            ids=ids,
            n=_number(body, "n", 1, int, low=1),
            temperature=_number(body, "temperature", 1.0, float, low=0.0),
            top_k=None if top_k <= 0 else top_k,
            max_tokens=max_tokens,
            seed=int(seed),
            stop=stop,
            stop_ids=[int(t) for t in stop_ids],
            tools=bool(tools),
        )

    # --- the model side ------------------------------------------------------------------------------
    def _schedule(self) -> None:
        """Take the requests waiting (up to max_batch_rows rows), run each group of equal sampling settings as one
        batch, answer each request; repeat until the server closes."""
        while True:
            job = self._queue.get()
            if job is None:
                return
            jobs, rows = [job], job.n
            deadline = time.monotonic() + self.batch_window_s
            while rows < self.max_batch_rows:
                try:
                    nxt = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                jobs.append(nxt)
                rows += nxt.n
            groups: dict[tuple, list[_Job]] = {}
            for j in jobs:
                groups.setdefault((j.temperature, j.top_k, tuple(sorted(j.stop_ids))), []).append(j)
            for group in groups.values():
                try:
                    self._run(group)
                except BaseException as error:  # answered as HTTP 500 by each request
                    log.exception("the local server's batch failed")
                    for j in group:
                        j.error = error
                for j in group:
                    j.done.set()

    def _run(self, jobs: Sequence[_Job]) -> None:
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        eos = {int(tok.eos_token_id)} if tok.eos_token_id is not None else set()
        rows = [j.ids for j in jobs for _ in range(j.n)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        stop_ids = sorted(eos.union(jobs[0].stop_ids))  # one group: equal stop ids
        streams = RowStreams([(torch.Generator().manual_seed(j.seed), j.n) for j in jobs])
        self.batches += 1
        was_training = self.model.training
        self.model.eval()
        try:
            out = sample(
                self.model,
                ids,
                mask,
                max_new_tokens=max(j.max_tokens for j in jobs),
                temperature=jobs[0].temperature,
                generator=streams,
                eos_token_id=stop_ids or None,
                pad_token_id=int(pad),
                top_k=jobs[0].top_k,
            )
        finally:
            self.model.train(was_training)
        completion = out.completion_ids.tolist()
        live = out.completion_mask.tolist()
        row = 0
        for j in jobs:
            ends = set(j.stop_ids) | eos
            result = []
            for _ in range(j.n):
                tokens = [t for t, m in zip(completion[row], live[row]) if m][: j.max_tokens]
                row += 1
                finish = "length"
                if tokens and tokens[-1] in ends:
                    finish = "stop"
                    tokens = tokens[:-1] if tokens[-1] in eos else tokens
                text = tok.decode(tokens, skip_special_tokens=True)
                for s in j.stop:
                    at = text.find(s)
                    if at >= 0:
                        text, finish = text[:at], "stop"
                result.append({"text": text, "finish_reason": finish, "tokens": len(tokens)})
            j.result = result
