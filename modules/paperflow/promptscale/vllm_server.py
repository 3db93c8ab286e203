"""PromptScale's generation jobs on the kit's vLLM server and client (paperflow.core.lm.serve; envs/lm-serve.yaml,
standard library only), under the config's `vllm` block:

    with served(model_folder, "q", cfg["vllm"], log_path) as client:     # starts `vllm serve`, waits, stops it
        texts = complete_each(client, prompts, n=8, temperature=1.0, top_p=1.0, max_tokens=2048, seed=0, stop=[...])

`vllm.base_url` set in the config (without /v1) uses that server instead of starting one (its served model name must
be the one asked for). Requests run `vllm.max_concurrency` at a time, retried `vllm.retries` times. Each prompt's
request carries the seed `seed + its index`, so a prompt's samples do not depend on the batching.

Long jobs resume (README, "Long jobs resume"): a rule passes `journal_at(job.checkpoint_dir() / "rows.jsonl")`'s
journal to `complete_each` / `chat_each` (with a `tag` per call of the job); each finished prompt's samples are appended
there as {"id": tag + index, "request": digest, "samples"}, and a rerun sends only the prompts not journalled yet
(their seeds are still `seed + index`), so its samples are those of an uninterrupted run. A journalled row whose
request differs (another prompt or sampling at that place) is refused.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from paperflow.core.lm import serve
from paperflow.core.lm.serve import Client
from paperflow.core.resume import RowJournal


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


@contextmanager
def journal_at(path: str | Path | None) -> Iterator[RowJournal | None]:
    """The RowJournal at `path` (a file in the job's checkpoint folder) for the block, or None when `path` is None
    (a caller outside a Snakemake job: nothing is journalled, as before)."""
    if path is None:
        yield None
        return
    with RowJournal(path, key="id") as journal:
        yield journal


def journalled(journal: RowJournal | None, tag: str, count: int) -> bool:
    """Whether every one of `count` prompts of call `tag` has its row in `journal` (a rerun need not serve)."""
    return journal is not None and all(f"{tag}{i}" in journal for i in range(count))


def _digest(request: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(request, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


def _each(
    client: Client | None,
    requests: Sequence[dict[str, Any]],
    send: Callable[[dict[str, Any]], list[dict[str, Any]]],
    journal: RowJournal | None,
    tag: str,
) -> list[list[dict[str, Any]]]:
    """`send` of each request, `vllm.max_concurrency` at a time; with a journal, only the requests without a row
    there, each one's samples appended as it finishes, and every request's samples read back from the journal."""
    if journal is None:
        return client.map(send, list(requests))
    ids = [f"{tag}{i}" for i in range(len(requests))]
    digests = [_digest(r) for r in requests]
    lock = threading.Lock()

    def one(i: int) -> None:
        samples = send(requests[i])
        with lock:
            journal.append({"id": ids[i], "request": digests[i], "samples": samples})

    todo = [i for i in range(len(requests)) if ids[i] not in journal]
    if todo:  # none left: the client (None where the caller did not serve) is not asked
        client.map(one, todo)
    rows = journal.complete(ids)
    for row, digest in zip(rows, digests):
        if row["request"] != digest:
            raise ValueError(f"{journal.path}: row {row['id']!r} was journalled for another request; remove the file")
    return [[{"text": c["text"], "finish_reason": c["finish_reason"]} for c in row["samples"]] for row in rows]


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
    journal: RowJournal | None = None,
    tag: str = "",
) -> list[list[dict[str, Any]]]:
    """`n` samples per prompt from /v1/completions (raw text, no chat template), prompt i with seed `seed + i`:
    per prompt a list of {"text", "finish_reason"}. With `journal`, prompt i's samples are its row `tag` + i there
    (module docstring): a rerun sends only the prompts without one."""
    stop = list(stop) if stop else None
    requests = [
        dict(prompt=prompt, n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
             seed=seed + i, stop=stop)
        for i, prompt in enumerate(prompts)
    ]  # fmt: skip

    def send(request):
        return [
            _sample(c)
            for c in client.complete(request["prompt"], **{k: v for k, v in request.items() if k != "prompt"})
        ]

    return _each(client, requests, send, journal, tag)


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
    journal: RowJournal | None = None,
    tag: str = "",
) -> list[list[dict[str, Any]]]:
    """`n` samples per user message from /v1/chat/completions (the model's chat template), message i with seed
    `seed + i`: per message a list of {"text", "finish_reason"}. With `journal`, as `complete_each`."""
    requests = [
        dict(messages=[{"role": "user", "content": content}], n=n, temperature=temperature, top_p=top_p, top_k=top_k,
             max_tokens=max_tokens, seed=seed + i)
        for i, content in enumerate(messages)
    ]  # fmt: skip

    def send(request):
        return [
            _sample(c)
            for c in client.chat(request["messages"], **{k: v for k, v in request.items() if k != "messages"})
        ]

    return _each(client, requests, send, journal, tag)


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
