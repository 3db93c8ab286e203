"""The user simulator and LLM judge at paper scale: Qwen2.5-14B-Instruct behind vLLM's OpenAI-compatible server
(the ITPO README, 3.1: `python -m vllm.entrypoints.openai.api_server --model ... --port 8001
--tensor-parallel-size 2`), started by the train and evaluate jobs on their own GPUs and stopped after them, through
the kit's paperflow.core.lm.serve.

The recipe itself talks to the server through litellm inside verl; here a readiness probe on /v1/models and one chat
completion run before verl starts, so that a server that cannot answer fails the job at once, naming its address.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paperflow.core.lm import serve

log = logging.getLogger(__name__)


def base_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{int(port)}/v1"


def server_command(simulator: Mapping[str, Any], folder: str | Path, python: str = "python3") -> list[str]:
    """vLLM's OpenAI-compatible server for the simulator's weights in `folder` under its Hub name (the name the
    recipe's litellm calls ask for), on loopback only, with vLLM's defaults otherwise (as the README starts it)."""
    return serve.vllm_command(
        folder,
        str(simulator["served_name"]),
        port=int(simulator["port"]),
        tensor_parallel_size=int(simulator["tensor_parallel"]),
        generation_config=None,
        python=python,
    )


def chat(
    url: str,
    model: str,
    messages: Sequence[Mapping[str, str]],
    temperature: float = 0.0,
    max_tokens: int = 512,
    timeout: float = 300.0,
) -> str:
    """One /v1/chat/completions call, not retried; the first choice's text."""
    client = serve.Client(url, model, timeout_s=timeout, retries=0)
    (choice,) = client.chat(list(messages), temperature=temperature, max_tokens=int(max_tokens))
    content = (choice.get("message") or {}).get("content")
    if not isinstance(content, str):
        raise serve.ServerError(f"{url}/chat/completions returned no text: {json.dumps(choice)[:500]}")
    return content


def probe(url: str, model: str) -> str:
    """A one-line greedy exchange with the simulator (what the judge and the user both need to work)."""
    return chat(url, model, [{"role": "user", "content": "Reply with the single word: ready"}], 0.0, 8)


@contextmanager
def served(
    cmd: Sequence[str], url: str, model: str, timeout_s: float, log_path: str | Path, env: Mapping[str, str]
) -> Iterator[subprocess.Popen]:
    """The server `cmd` running (stdout/stderr to `log_path`, environment `env` over this one) until the block
    ends; it lists `model` and answers a probe when the block starts, and is terminated (then killed) after it."""
    with serve.served(cmd, url, served_name=model, timeout_s=timeout_s, log_path=log_path, env=env, poll_s=5.0) as proc:
        log.info("simulator %s up at %s; probe: %r", model, url, probe(url, model))
        yield proc
