"""The user simulator and LLM judge at paper scale: Qwen2.5-14B-Instruct behind vLLM's OpenAI-compatible server
(the ITPO README, 3.1: `python -m vllm.entrypoints.openai.api_server --model ... --port 8001
--tensor-parallel-size 2`), started by the train and evaluate jobs on their own GPUs and stopped after them.

The HTTP side is plain `urllib` (the recipe itself talks to the server through litellm inside verl): a readiness
probe on /v1/models and one chat completion, both used before verl starts so that a server that cannot answer
fails the job at once, naming its address.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def base_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{int(port)}/v1"


def server_command(simulator: Mapping[str, Any], folder: str | Path, python: str = "python3") -> list[str]:
    """vLLM's OpenAI-compatible server for the simulator's weights in `folder` under its Hub name (the name the
    recipe's litellm calls ask for), on loopback only."""
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        str(simulator["served_name"]),
        "--host",
        "127.0.0.1",
        "--port",
        str(int(simulator["port"])),
        "--tensor-parallel-size",
        str(int(simulator["tensor_parallel"])),
    ]


def _request(url: str, body: Mapping[str, Any] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (a loopback URL from the config)
        return json.loads(resp.read().decode())


def served_models(url: str, timeout: float = 10.0) -> list[str]:
    """The model ids the server at `url` (…/v1) serves."""
    return [m["id"] for m in _request(f"{url}/models", timeout=timeout)["data"]]


def wait_ready(url: str, model: str, timeout_s: float, poll_s: float = 5.0, process=None) -> float:
    """Poll `url`/models until it lists `model`; seconds waited. Fails naming the address when the server
    process ends first or `timeout_s` passes, or when it serves other models."""
    start, wait = time.monotonic(), min(0.1, poll_s)
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the simulator server for {url} exited with code {process.returncode} before it was up")
        try:
            models = served_models(url)
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            models = None
        if models is not None:
            if model not in models:
                raise RuntimeError(f"{url} serves {models}, not {model!r} (simulator.served_name)")
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"the simulator at {url} did not answer within {timeout_s:.0f} s")
        time.sleep(wait)
        wait = min(2 * wait, poll_s)  # quick at first, then every poll_s


def chat(
    url: str,
    model: str,
    messages: Sequence[Mapping[str, str]],
    temperature: float = 0.0,
    max_tokens: int = 512,
    timeout: float = 300.0,
) -> str:
    """One /v1/chat/completions call; the first choice's text."""
    body = {"model": model, "messages": list(messages), "temperature": temperature, "max_tokens": int(max_tokens)}
    try:
        doc = _request(f"{url}/chat/completions", body, timeout=timeout)
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{url}/chat/completions answered HTTP {err.code}: {err.read()[:500]!r}") from err
    content = doc["choices"][0]["message"].get("content")
    if not isinstance(content, str):
        raise RuntimeError(f"{url}/chat/completions returned no text: {json.dumps(doc)[:500]}")
    return content


def probe(url: str, model: str) -> str:
    """A one-line greedy exchange with the simulator (what the judge and the user both need to work)."""
    return chat(url, model, [{"role": "user", "content": "Reply with the single word: ready"}], 0.0, 8)


@contextmanager
def served(
    cmd: Sequence[str], url: str, model: str, timeout_s: float, log_path: str | Path, env: Mapping[str, str]
) -> Iterator[subprocess.Popen]:
    """The server `cmd` running (stdout/stderr to `log_path`, environment `env` over this one) until the block
    ends; it is up and answers a probe when the block starts, and is terminated (then killed) after it."""
    with open(log_path, "a") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            waited = wait_ready(url, model, timeout_s, process=proc)
            log.info("simulator %s up at %s after %.0f s; probe: %r", model, url, waited, probe(url, model))
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
