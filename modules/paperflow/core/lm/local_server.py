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
A body the server cannot honour (an unknown model, a key it does not implement, a bad value) is answered 400 or
404 with one line naming the key, never silently ignored.

Sampling is the kit's `sampling.sample` (KV-cached, inverse-CDF draws). Requests that arrive together are run as
one batch (those of equal temperature, top_k and stop ids together); each request draws its uniforms from its own generator, seeded by its `seed` (or by the server's
stream when it has none), so a request's samples do not depend on which requests share its batch, up to the
floating-point rounding of a differently padded batch (tested equal on the tiny models).
"""

from __future__ import annotations

import json
import logging
import queue
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
}


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
            {"index": i, "message": {"role": "assistant", "content": c["text"]}, "finish_reason": c["finish_reason"]}
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

    def _job(self, route: str, body: Mapping[str, Any]) -> _Job:
        unknown = sorted(set(body) - KNOWN_KEYS)
        if unknown:
            raise BadRequest(f"{unknown[0]}: not implemented by the kit's local server; allowed: {sorted(KNOWN_KEYS)}")
        if body.get("stream"):
            raise BadRequest("stream: not implemented by the kit's local server; allowed: false")
        top_p = _number(body, "top_p", 1.0, float)
        if top_p != 1.0:
            raise BadRequest(f"top_p: the kit's local server samples the full law only; allowed: 1.0, got {top_p}")
        if route.endswith("chat/completions"):
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages: expected a non-empty list of {role, content}")
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, Mapping):
                ids = ids["input_ids"]
        else:
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
