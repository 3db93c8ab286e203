"""A model served by vLLM behind its OpenAI-compatible HTTP API, for paper-scale jobs (standard library only: the job
talks to the server over HTTP, so this module runs in any env, vLLM's own included):

    command = vllm_command(folder, "policy", port=8000, tensor_parallel_size=2, dtype="bfloat16")
    with served(command, "http://127.0.0.1:8000/v1", served_name="policy", timeout_s=1800, log_path=log):
        client = Client("http://127.0.0.1:8000/v1", "policy", timeout_s=300, retries=3, backoff_s=2.0)
        choices = client.chat(messages, n=4, temperature=1.0, max_tokens=512, seed=0)

`served` starts the command (its output to a log file), waits until `GET <base_url>/models` answers (and lists the
served name when one is given), and stops the process at the end: SIGTERM, then SIGKILL after `stop_timeout_s`. With
no command it only waits for the server already running at `base_url`. Every error names the log and shows its tail.

`Client` posts to `<base_url>/chat/completions` and `<base_url>/completions` (base_url ends in /v1): connection
errors, timeouts, HTTP 429 and 5xx are retried with exponential backoff; any other HTTP status fails at once with the
server's message. Both calls return the choices in index order and check that `n` came back.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    """A request that cannot succeed (a 4xx, or retries spent), or a server that stopped or never became ready."""


def vllm_command(
    model_folder: str | Path,
    served_name: str,
    *,
    port: int,
    tensor_parallel_size: int = 1,
    dtype: str | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    generation_config: str | None = "vllm",
    extra: Sequence[Any] = (),
    host: str = "127.0.0.1",
    python: str | None = None,
) -> list[str]:
    """`vllm serve <model_folder>` under `served_name` on `host`:`port` (loopback by default). A None option is left
    to vLLM's default; `generation_config="vllm"` keeps the model's generation_config.json from overriding the
    sampling each request states. `extra` is appended as given (parsers, prefix caching, overrides). With `python`,
    the same server through that interpreter: `<python> -m vllm.entrypoints.openai.api_server --model <folder>`."""
    if python:
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_folder)]
    else:
        cmd = ["vllm", "serve", str(model_folder)]
    cmd += ["--served-model-name", str(served_name), "--host", host, "--port", str(int(port))]
    cmd += ["--tensor-parallel-size", str(int(tensor_parallel_size))]
    if dtype is not None:
        cmd += ["--dtype", str(dtype)]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(int(max_model_len))]
    if gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(float(gpu_memory_utilization))]
    if generation_config is not None:
        cmd += ["--generation-config", str(generation_config)]
    return cmd + [str(a) for a in extra]


def log_tail(path: str | Path | None, lines: int = 30) -> str:
    """The last `lines` lines of a server log, for error messages."""
    if path is None or not Path(path).is_file():
        return "(no log)"
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


def served_models(base_url: str, timeout_s: float = 10.0) -> list[str]:
    """The model names the server at `base_url` (…/v1) lists at /models."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=timeout_s) as response:  # noqa: S310
        return [m.get("id") for m in json.loads(response.read()).get("data", [])]


def wait_ready(
    base_url: str,
    *,
    timeout_s: float,
    served_name: str | None = None,
    process: subprocess.Popen | None = None,
    log_path: str | Path | None = None,
    poll_s: float = 1.0,
) -> float:
    """Poll `GET <base_url>/models` until it answers (and lists `served_name`, when given); the seconds waited.
    ServerError when `process` exits first, `timeout_s` passes, or the server lists other models."""
    start, wait = time.monotonic(), min(0.1, poll_s)  # quick at first, then every poll_s
    while True:
        if process is not None and process.poll() is not None:
            raise ServerError(
                f"the server for {base_url} exited with status {process.returncode} before it was ready "
                f"(log: {log_path}); its log ends:\n{log_tail(log_path)}"
            )
        try:
            names = served_models(base_url, timeout_s=5)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError, json.JSONDecodeError):
            names = None
        if names is not None:
            if served_name is None or served_name in names:
                return time.monotonic() - start
            raise ServerError(f"{base_url} serves {names}, not {served_name!r}")
        if time.monotonic() - start > timeout_s:
            raise ServerError(
                f"the server at {base_url} was not ready after {timeout_s} s (log: {log_path}); its log ends:\n"
                f"{log_tail(log_path)}"
            )
        time.sleep(wait)
        wait = min(2 * wait, poll_s)


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:
    """End a server started by a job: SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def served(
    command: Sequence[str] | None,
    base_url: str,
    *,
    timeout_s: float,
    served_name: str | None = None,
    log_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    poll_s: float = 1.0,
    stop_timeout_s: float = 60.0,
) -> Iterator[subprocess.Popen | None]:
    """The server at `base_url` ready for the block: `command` started here (output appended to `log_path`,
    environment `env` over this one) and stopped after the block, or, with no command, the one already running
    there. Yields the process (None when nothing was started)."""
    if not command:
        wait_ready(base_url, timeout_s=timeout_s, served_name=served_name, log_path=log_path, poll_s=poll_s)
        yield None
        return
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    log.info("starting the model server: %s", shlex.join(command))
    sink = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        list(command),
        stdout=sink,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )  # in the job's process group, so that a job killed from outside takes its server with it
    try:
        waited = wait_ready(
            base_url, timeout_s=timeout_s, served_name=served_name, process=process, log_path=log_path, poll_s=poll_s
        )
        log.info("the model server at %s is ready after %.0f s", base_url, waited)
        yield process
    finally:
        stop_process(process, stop_timeout_s)
        if log_path is not None:
            sink.close()


class Client:
    """Chat completions and completions of one served model (`base_url` ends in /v1)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 300.0,
        retries: int = 3,
        backoff_s: float = 2.0,
        concurrency: int = 1,
        api_key: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.concurrency = max(int(concurrency), 1)
        self.api_key = api_key
        self.retried = 0  # retries made by this client's posts so far (the ReAct harness reports them)
        self._lock = threading.Lock()

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST `body` as JSON to `<base_url><path>`; the reply's JSON. Retries connection errors, timeouts, 429 and
        5xx (waiting backoff_s, 2 backoff_s, ...); any other HTTP status raises ServerError with the server's text."""
        data = json.dumps(body).encode()
        url = self.base_url + path
        headers = {"Content-Type": "application/json"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = None
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")[:500]
                if error.code != 429 and error.code < 500:
                    raise ServerError(f"POST {url}: HTTP {error.code}: {detail}") from error
                last = f"HTTP {error.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                last = f"{type(error).__name__}: {error}"
            if attempt < self.retries:
                with self._lock:
                    self.retried += 1
                wait = self.backoff_s * 2**attempt
                log.warning("POST %s failed (%s); retry %d/%d in %.1f s", url, last, attempt + 1, self.retries, wait)
                time.sleep(wait)
        raise ServerError(f"POST {url} failed after {self.retries + 1} attempts; last error: {last}")

    def _choices(self, path: str, body: dict[str, Any], n: int | None) -> list[dict[str, Any]]:
        doc = self.post(path, body)
        choices = sorted(doc.get("choices") or [], key=lambda c: c.get("index", 0))
        want = 1 if n is None else int(n)
        if len(choices) != want:
            raise ServerError(
                f"POST {self.base_url}{path}: asked for n={want} choices, got {len(choices)}: {str(doc)[:300]}"
            )
        return choices

    def _body(self, key: str, value: Any, n: int | None, params: Mapping[str, Any]) -> dict[str, Any]:
        body = {"model": self.model, key: value}
        if n is not None:
            body["n"] = int(n)
        return body | {k: v for k, v in params.items() if v is not None}

    def chat(self, messages: Sequence[Mapping[str, Any]], *, n: int | None = None, **params: Any) -> list[dict]:
        """The choices of one /chat/completions request, in index order; `params` (temperature, max_tokens, seed,
        ...) go into the body as given, None ones left out; `n` is sent only when given (one choice otherwise)."""
        return self._choices("/chat/completions", self._body("messages", list(messages), n, params), n)

    def complete(self, prompt: str | Sequence[int], *, n: int | None = None, **params: Any) -> list[dict]:
        """The choices of one /completions request, in index order; as `chat`. `prompt` is raw text (no chat
        template) or a list of token ids, which vLLM's completions endpoint takes as the prompt's tokens."""
        return self._choices("/completions", self._body("prompt", prompt, n, params), n)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        """`fn` over `items`, `concurrency` requests at a time, results in the items' order."""
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(fn, items))


def text_of(choice: Mapping[str, Any]) -> str:
    """A choice's text: the message content of a chat completion, the text of a completion ('' when empty)."""
    if "message" in choice:
        return (choice.get("message") or {}).get("content") or ""
    return choice.get("text") or ""
