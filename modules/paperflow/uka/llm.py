"""The LLM behind UKA's paper scale: the kit's vLLM server and client (paperflow.core.lm.serve) under UKA's names
and config keys (`server` block).

    with served(vllm_command(folder, server, gpus=1, dtype="bfloat16"), server, log_path) as client:
        texts = chat_texts(client, messages, temperature=1.1, max_tokens=16, n=10, seed=7)

A config with `server.base_url` set uses that server instead and starts nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paperflow.core.lm import serve
from paperflow.core.lm.serve import Client, ServerError

SERVED_NAME = "uka-backbone"  # the model name the agent, simulator and critic requests use
JUDGE_NAME = "uka-judge"  # the judge's model (another model: issue 46)


def vllm_command(
    model_folder: str, server: Mapping[str, Any], gpus: int, dtype: str, name: str = SERVED_NAME
) -> list[str]:
    """The `vllm serve` command line of the job's server: the downloaded snapshot under `name` (SERVED_NAME, or
    JUDGE_NAME for the judge), on 127.0.0.1:`server.port`, over the job's `gpus` (tensor parallel)."""
    return serve.vllm_command(
        model_folder,
        name,
        port=int(server["port"]),
        tensor_parallel_size=max(int(gpus), 1),
        dtype=str(dtype),
        max_model_len=int(server["max_model_len"]),
        gpu_memory_utilization=float(server["gpu_memory_utilization"]),
    )


def local_url(server: Mapping[str, Any]) -> str:
    return f"http://127.0.0.1:{int(server['port'])}/v1"


def client_for(base_url: str, server: Mapping[str, Any], name: str = SERVED_NAME) -> Client:
    return Client(base_url, name, timeout_s=server["timeout_s"], retries=server["retries"])


def chat_texts(
    client: Client,
    messages: Sequence[Mapping[str, str]],
    *,
    temperature: float,
    max_tokens: int,
    n: int = 1,
    seed: int | None = None,
) -> list[str]:
    """The `n` completions of one chat request, in choice order (the body UKA sends: role and content of each
    message, temperature, max_tokens, n and the seed when given)."""
    choices = client.chat(
        [{"role": m["role"], "content": m["content"]} for m in messages],
        temperature=float(temperature),
        max_tokens=int(max_tokens),
        n=int(n),
        seed=None if seed is None else int(seed),
    )
    return [serve.text_of(c) for c in choices]


@contextmanager
def served(
    command: Sequence[str] | None,
    server: Mapping[str, Any],
    log_path: str | Path,
    name: str = SERVED_NAME,
    url_key: str = "base_url",
) -> Iterator[Client]:
    """A client of the job's LLM server (model `name`): `server[url_key]` when the config names one (nothing is
    started), else `command` started here (its output to `log_path`), waited for, and terminated on exit."""
    external = server.get(url_key)
    if not external and not command:
        raise ServerError("no server.base_url in the config and no server command to start")
    base_url = external or local_url(server)
    with serve.served(None if external else command, base_url, timeout_s=server["ready_timeout_s"], log_path=log_path):
        yield client_for(base_url, server, name)
