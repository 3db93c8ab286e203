"""PromptScale's generation jobs on the kit's vLLM server and client (paperflow.core.lm.serve; envs/lm-serve.yaml,
standard library only), under the config's `vllm` block:

    with served(model_folder, "q", cfg["vllm"], log_path) as client:     # starts `vllm serve`, waits, stops it
        texts = complete_each(client, prompts, n=8, temperature=1.0, top_p=1.0, max_tokens=2048, seed=0, stop=[...])

`vllm.base_url` set in the config (without /v1) uses that server instead of starting one (its served model name must
be the one asked for). Requests run `vllm.max_concurrency` at a time, retried `vllm.retries` times. Each prompt's
request carries the seed `seed + its index`, so a prompt's samples do not depend on the batching.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paperflow.core.lm import serve
from paperflow.core.lm.serve import Client


def serve_command(model_folder: str | Path, served_name: str, cfg: Mapping[str, Any], dtype: str) -> list[str]:
    """The `vllm serve` command line of one generation job: the model at `model_folder` served as `served_name` on
    127.0.0.1:`vllm.port` with the config's parallelism, memory share and context length."""
    return serve.vllm_command(
        model_folder,
        served_name,
        port=int(cfg["port"]),
        tensor_parallel_size=int(cfg["tensor_parallel_size"]),
        gpu_memory_utilization=float(cfg["gpu_memory_utilization"]),
        max_model_len=int(cfg["max_model_len"]),
        dtype=dtype,
    )


def _sample(choice: Mapping[str, Any]) -> dict[str, Any]:
    return {"text": serve.text_of(choice), "finish_reason": choice.get("finish_reason")}


def complete_each(
    client: Client,
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
    """`n` samples per prompt from /v1/completions (raw text, no chat template), prompt i with seed `seed + i`:
    per prompt a list of {"text", "finish_reason"}."""

    def one(item):
        i, prompt = item
        params = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed + i)
        return [_sample(c) for c in client.complete(prompt, n=n, **params, stop=list(stop) if stop else None)]

    return client.map(one, list(enumerate(prompts)))


def chat_each(
    client: Client,
    messages: Sequence[str],
    *,
    n: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int,
    top_k: int = -1,
) -> list[list[dict[str, Any]]]:
    """`n` samples per user message from /v1/chat/completions (the model's chat template), message i with seed
    `seed + i`: per message a list of {"text", "finish_reason"}."""

    def one(item):
        i, content = item
        params = dict(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed + i)
        return [_sample(c) for c in client.chat([{"role": "user", "content": content}], n=n, **params)]

    return client.map(one, list(enumerate(messages)))


@contextmanager
def served(
    model_folder: str | Path, name: str, cfg: Mapping[str, Any], log_path: str | Path, dtype: str = "bfloat16"
) -> Iterator[Client]:
    """A Client of the model at `model_folder`, served as `name`: by `vllm.base_url` when the config sets one
    (checked to list `name`), else by a `vllm serve` started here for the duration of the block."""
    root = cfg.get("base_url") or f"http://127.0.0.1:{int(cfg['port'])}"
    url = root.rstrip("/") + "/v1"
    command = None if cfg.get("base_url") else serve_command(model_folder, name, cfg, dtype)
    with serve.served(command, url, served_name=name, timeout_s=cfg["startup_timeout_s"], log_path=log_path):
        yield Client(
            url,
            name,
            timeout_s=cfg["request_timeout_s"],
            retries=cfg["retries"],
            backoff_s=1.0,
            concurrency=cfg["max_concurrency"],
        )
