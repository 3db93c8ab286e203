# TODO(kit): a candidate for paperflow.core.lm.serve (itpo, eapo, enterpriseops_gym and dualreform serve models with
# vLLM too); the proposed move is in /work/notes/promptscale_paper_scale.md.
"""vLLM behind its OpenAI-compatible HTTP API, for the paper-scale generation jobs (envs/lm-serve.yaml; standard
library only, the job talks to the server over HTTP):

    with served(model_folder, "q", cfg["vllm"], log_path) as client:     # starts `vllm serve`, waits, stops it
        texts = client.complete(prompts, n=8, temperature=1.0, top_p=1.0, max_tokens=2048, seed=0, stop=[...])

`vllm.base_url` set in the config uses that server instead of starting one (its served model name must be the one
asked for). Requests run `vllm.max_concurrency` at a time; a connection error, a timeout or an HTTP 5xx / 429 is
retried `vllm.retries` times with exponential backoff; any other HTTP error stops the job with the server's message.
Each prompt's request carries the seed `seed + its index`, so a prompt's samples do not depend on the batching.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_RETRY_STATUS = {429, 500, 502, 503, 504}


class ServerError(RuntimeError):
    """The server refused a request (a 4xx), stopped, or never became ready."""


def serve_command(model_folder: str | Path, served_name: str, cfg: Mapping[str, Any], dtype: str) -> list[str]:
    """The `vllm serve` command line of one generation job: the model at `model_folder` served as `served_name` on
    127.0.0.1:`vllm.port` with the config's parallelism, memory share and context length. `--generation-config vllm`
    keeps the model's generation_config.json from overriding the sampling each request states."""
    return [
        "vllm",
        "serve",
        str(model_folder),
        "--served-model-name",
        served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(int(cfg["port"])),
        "--tensor-parallel-size",
        str(int(cfg["tensor_parallel_size"])),
        "--gpu-memory-utilization",
        str(float(cfg["gpu_memory_utilization"])),
        "--max-model-len",
        str(int(cfg["max_model_len"])),
        "--dtype",
        dtype,
        "--generation-config",
        "vllm",
    ]


class Client:
    """Completions and chat completions of one served model."""

    def __init__(self, base_url: str, model: str, timeout_s: float, retries: int, concurrency: int):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.concurrency = int(concurrency)

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(
                f"{self.base_url}{path}", data=data, headers={"Content-Type": "application/json"}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")[:500]
                if error.code not in _RETRY_STATUS or attempt == self.retries:
                    raise ServerError(f"POST {self.base_url}{path}: HTTP {error.code}: {detail}") from error
                reason = f"HTTP {error.code}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                if attempt == self.retries:
                    raise ServerError(f"POST {self.base_url}{path}: {error} after {attempt + 1} attempts") from error
                reason = str(error)
            wait = 2.0**attempt
            log.warning("POST %s failed (%s); retry %d/%d in %.0f s", path, reason, attempt + 1, self.retries, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _choices(self, body: Mapping[str, Any], n: int, path: str) -> list[dict[str, Any]]:
        choices = sorted(self._post(path, body)["choices"], key=lambda c: c["index"])
        if len(choices) != n:
            raise ServerError(f"POST {path}: asked for n={n} samples, got {len(choices)}")
        return choices

    def _map(self, fn, items: Sequence[Any]) -> list[Any]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(fn, items))

    def complete(
        self,
        prompts: Sequence[str],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        stop: Sequence[str] | None = None,
        top_k: int = -1,
    ) -> list[list[dict[str, Any]]]:
        """`n` samples per prompt from /v1/completions (raw text, no chat template): per prompt a list of
        {"text", "finish_reason"}."""

        def one(item):
            i, prompt = item
            body = {
                "model": self.model,
                "prompt": prompt,
                "n": n,
                "temperature": temperature,
                "top_p": top_p,
                "top_k": top_k,
                "max_tokens": max_tokens,
                "seed": seed + i,
            }
            if stop:
                body["stop"] = list(stop)
            return [
                {"text": c["text"], "finish_reason": c.get("finish_reason")}
                for c in self._choices(body, n, "/v1/completions")
            ]

        return self._map(one, list(enumerate(prompts)))

    def chat(
        self,
        messages: Sequence[str],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: int,
        seed: int,
        top_k: int = -1,
    ) -> list[list[dict[str, Any]]]:
        """`n` samples per user message from /v1/chat/completions (the model's chat template): per message a list
        of {"text", "finish_reason"}."""

        def one(item):
            i, content = item
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": content}],
                "n": n,
                "temperature": temperature,
                "top_p": top_p,
                "top_k": top_k,
                "max_tokens": max_tokens,
                "seed": seed + i,
            }
            return [
                {"text": c["message"].get("content") or "", "finish_reason": c.get("finish_reason")}
                for c in self._choices(body, n, "/v1/chat/completions")
            ]

        return self._map(one, list(enumerate(messages)))


def served_models(base_url: str, timeout_s: float = 10.0) -> list[str]:
    """The model names a server lists at /v1/models."""
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/v1/models", timeout=timeout_s) as response:
        return [m["id"] for m in json.loads(response.read())["data"]]


def wait_ready(base_url: str, model: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    """Poll /v1/models until it lists `model`; ServerError when the process exits first or time runs out."""
    deadline = time.monotonic() + float(timeout_s)
    while True:
        if process is not None and process.poll() is not None:
            raise ServerError(f"the vLLM server exited with status {process.returncode} before it was ready")
        try:
            names = served_models(base_url)
            if model in names:
                return
            raise ServerError(f"{base_url} serves {names}, not {model!r}")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"{base_url}: {model!r} not ready after {timeout_s} s (vllm.startup_timeout_s)")
        time.sleep(1.0)


@contextlib.contextmanager
def launched(command: Sequence[str], base_url: str, model: str, timeout_s: float, log_path: str | Path) -> Iterator:
    """Run `command` (a server) with its output in `log_path`, wait until `model` is served, and stop it (SIGTERM,
    then SIGKILL after 60 s) on the way out, whatever happened inside."""
    log.info("starting: %s", shlex.join(command))
    with open(log_path, "ab") as out:
        process = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(base_url, model, timeout_s, process)
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@contextlib.contextmanager
def served(
    model_folder: str | Path, name: str, cfg: Mapping[str, Any], log_path: str | Path, dtype: str = "bfloat16"
) -> Iterator[Client]:
    """A Client of the model at `model_folder`, served as `name`: by `vllm.base_url` when the config sets one
    (checked to list `name`), else by a `vllm serve` started here for the duration of the block."""

    def client(url: str) -> Client:
        return Client(url, name, cfg["request_timeout_s"], cfg["retries"], cfg["max_concurrency"])

    if cfg.get("base_url"):
        wait_ready(cfg["base_url"], name, cfg["startup_timeout_s"])
        yield client(cfg["base_url"])
        return
    url = f"http://127.0.0.1:{int(cfg['port'])}"
    command = serve_command(model_folder, name, cfg, dtype)
    with launched(command, url, name, cfg["startup_timeout_s"], log_path):
        yield client(url)
