"""The LLM behind UKA's paper scale: an OpenAI-compatible chat client and the vLLM server a GPU job starts for it.

    with served(vllm_command(folder, server, gpus=1), server) as client:     # one vLLM process for the job
        texts = client.chat(messages, temperature=1.1, max_tokens=16, n=10, seed=7)

`ChatClient` speaks `POST <base_url>/chat/completions` (the OpenAI API that `vllm serve` exposes) with the standard
library only: retries with exponential backoff on connection errors, timeouts, HTTP 429 and 5xx; any other HTTP
status fails at once with the server's message. `served` starts the command, waits until `GET <base_url>/models`
answers, yields a client and stops the process (its output goes to a log file, whose tail is in every error). A
config with `server.base_url` set uses that server instead and starts nothing.

TODO(kit): a second paper that talks to a vLLM server would use this module as it is; the proposal to move it to
paperflow.core.lm.serve (with its tests) is in /work/notes/uka_paper_scale.md.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SERVED_NAME = "uka-backbone"  # the model name the agent, simulator and critic requests use


class LLMError(RuntimeError):
    """A chat request that cannot succeed, or a server that did not come up."""


class ChatClient:
    def __init__(self, base_url: str, model: str, timeout_s: float = 300.0, retries: int = 3, backoff_s: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        url = self.base_url + path
        last = None
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")[:500]
                if error.code != 429 and error.code < 500:
                    raise LLMError(f"POST {url}: HTTP {error.code}: {detail}") from error
                last = f"HTTP {error.code}: {detail}"
            except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
                last = f"{type(error).__name__}: {error}"
            if attempt < self.retries:
                wait = self.backoff_s * 2**attempt
                log.warning("POST %s failed (%s); retry %d/%d in %.1f s", url, last, attempt + 1, self.retries, wait)
                time.sleep(wait)
        raise LLMError(f"POST {url} failed after {self.retries + 1} attempts; last error: {last}")

    def chat(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        temperature: float,
        max_tokens: int,
        n: int = 1,
        seed: int | None = None,
    ) -> list[str]:
        """The `n` completions of one chat request, in choice order."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": float(temperature),
            "max_tokens": int(max_tokens),
            "n": int(n),
        }
        if seed is not None:
            body["seed"] = int(seed)
        doc = self._post("/chat/completions", body)
        choices = sorted(doc.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != n:
            raise LLMError(f"{self.base_url}: asked for {n} choices, got {len(choices)}: {str(doc)[:300]}")
        return [(c.get("message") or {}).get("content") or "" for c in choices]


def vllm_command(model_folder: str, server: Mapping[str, Any], gpus: int, dtype: str) -> list[str]:
    """The `vllm serve` command line of the job's server: the downloaded snapshot under the name SERVED_NAME, on
    127.0.0.1:`server.port`, over the job's `gpus` (tensor parallel)."""
    return [
        "vllm",
        "serve",
        str(model_folder),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(int(server["port"])),
        "--dtype",
        str(dtype),
        "--max-model-len",
        str(int(server["max_model_len"])),
        "--gpu-memory-utilization",
        str(float(server["gpu_memory_utilization"])),
        "--tensor-parallel-size",
        str(max(int(gpus), 1)),
        "--generation-config",
        "vllm",  # the request's sampling parameters, not the model's generation_config.json defaults
    ]


def local_url(server: Mapping[str, Any]) -> str:
    return f"http://127.0.0.1:{int(server['port'])}/v1"


def client_for(base_url: str, server: Mapping[str, Any]) -> ChatClient:
    return ChatClient(base_url, SERVED_NAME, timeout_s=server["timeout_s"], retries=server["retries"])


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else "(no log)"


def wait_ready(base_url: str, process: subprocess.Popen | None, timeout_s: float, log_path: Path) -> None:
    """Poll `GET <base_url>/models` until it answers 200; fail when the process exits or `timeout_s` passes."""
    deadline = time.monotonic() + float(timeout_s)
    while True:
        if process is not None and process.poll() is not None:
            raise LLMError(f"the LLM server exited with status {process.returncode}; its log ends:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            pass
        if time.monotonic() > deadline:
            raise LLMError(f"the LLM server at {base_url} was not ready after {timeout_s} s; log:\n{_tail(log_path)}")
        time.sleep(1.0)


@contextmanager
def served(command: Sequence[str] | None, server: Mapping[str, Any], log_path: str | Path) -> Iterator[ChatClient]:
    """A client of the job's LLM server: `server.base_url` when the config names one (nothing is started),
    else `command` started here (its output to `log_path`), waited for, and terminated on exit."""
    log_path = Path(log_path)
    if server.get("base_url"):
        wait_ready(server["base_url"], None, server["ready_timeout_s"], log_path)
        yield client_for(server["base_url"], server)
        return
    if not command:
        raise LLMError("no server.base_url in the config and no server command to start")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("starting the LLM server: %s", " ".join(command))
    with open(log_path, "ab") as sink:
        process = subprocess.Popen(list(command), stdout=sink, stderr=subprocess.STDOUT)
    try:
        base_url = local_url(server)
        wait_ready(base_url, process, server["ready_timeout_s"], log_path)
        yield client_for(base_url, server)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
