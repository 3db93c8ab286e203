"""The kit's vLLM server and OpenAI-compatible client (paperflow.core.lm.serve) against fake servers: an in-process
HTTP server for the client, a child process for the start / wait / stop of a server command."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest
from fake_openai import FakeOpenAI, echo

from paperflow.core.lm import serve


def fake_server(name: str = "m", fail: int = 0, fail_code: int = 503, short: bool = False) -> FakeOpenAI:
    """Echoes prompts; serves only `name`; answers n - `short` choices in reverse index order (the client must
    sort them)."""

    def answer(path: str, body: dict) -> list[dict]:
        return echo(path, {**body, "n": body.get("n", 1) - short})[::-1]

    return FakeOpenAI(answer, name=name, fail=fail, fail_code=fail_code)


@pytest.fixture
def fake():
    servers = []

    def start(**kw):
        servers.append(fake_server(**kw))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_the_client_retries_a_503_and_a_429_and_returns_the_choices_in_index_order(fake):
    server = fake(fail=1)
    client = serve.Client(server.url, "m", timeout_s=5, retries=2, backoff_s=0.01)
    choices = client.chat([{"role": "user", "content": "hi"}], n=3, temperature=0.5, max_tokens=4, seed=5)
    assert [serve.text_of(c) for c in choices] == ["hi 0", "hi 1", "hi 2"]
    assert len(server.bodies) == 2  # the 503, then the answer
    assert server.bodies[-1] == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 3,
        "temperature": 0.5,
        "max_tokens": 4,
        "seed": 5,
    }
    server = fake(fail=1, fail_code=429)
    client = serve.Client(server.url, "m", timeout_s=5, retries=1, backoff_s=0.01)
    assert [c["text"] for c in client.complete("p", n=2, seed=None, stop=["x"])] == ["p 0", "p 1"]
    assert server.bodies[-1] == {"model": "m", "prompt": "p", "n": 2, "stop": ["x"]}  # None params left out


def test_the_client_fails_at_once_on_a_4xx_with_the_servers_message_and_after_its_retries_on_5xx(fake):
    server = fake()
    wrong = serve.Client(server.url, "another-model", timeout_s=5, retries=3, backoff_s=0.01)
    with pytest.raises(serve.ServerError, match="HTTP 404: .*model another-model not served"):
        wrong.chat([{"role": "user", "content": "x"}], temperature=0, max_tokens=1)
    assert len(server.bodies) == 1  # no retry of a client error
    server = fake(fail=5)
    client = serve.Client(server.url, "m", timeout_s=5, retries=2, backoff_s=0.01)
    with pytest.raises(serve.ServerError, match="failed after 3 attempts; last error: HTTP 503"):
        client.chat([{"role": "user", "content": "x"}])
    assert len(server.bodies) == 3
    closed = serve.Client(f"http://127.0.0.1:{_free_port()}/v1", "m", timeout_s=5, retries=1, backoff_s=0.01)
    with pytest.raises(serve.ServerError, match="after 2 attempts; last error: URLError"):
        closed.complete("x")


def test_the_client_checks_n_sends_n_only_when_asked_and_the_api_key_as_a_bearer_token(fake):
    server = fake(short=True)
    client = serve.Client(server.url, "m", timeout_s=5, retries=0)
    with pytest.raises(serve.ServerError, match="asked for n=3 choices, got 2"):
        client.chat([{"role": "user", "content": "x"}], n=3)
    assert "Authorization" not in server.headers[-1]
    server = fake()
    client = serve.Client(server.url, "m", timeout_s=5, retries=0, api_key="sk-1")
    (choice,) = client.chat([{"role": "user", "content": "x"}], temperature=0.0)
    assert "n" not in server.bodies[-1] and serve.text_of(choice) == "x 0"
    assert server.headers[-1]["Authorization"] == "Bearer sk-1"


def test_map_keeps_the_items_order_over_concurrent_requests(fake):
    server = fake()
    client = serve.Client(server.url, "m", timeout_s=5, retries=0, concurrency=4)
    out = client.map(lambda p: serve.text_of(client.complete(p)[0]), [f"p{i}" for i in range(10)])
    assert out == [f"p{i} 0" for i in range(10)]


def test_the_vllm_command_line():
    cmd = serve.vllm_command(
        "/snap/qwen",
        "policy",
        port=8123,
        tensor_parallel_size=2,
        dtype="bfloat16",
        max_model_len=4096,
        gpu_memory_utilization=0.9,
        extra=["--enable-prefix-caching", "--seed", 3],
    )
    assert cmd[:3] == ["vllm", "serve", "/snap/qwen"] and cmd[-3:] == ["--enable-prefix-caching", "--seed", "3"]
    assert dict(zip(cmd[3:-3:2], cmd[4:-3:2], strict=True)) == {
        "--served-model-name": "policy",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--tensor-parallel-size": "2",
        "--dtype": "bfloat16",
        "--max-model-len": "4096",
        "--gpu-memory-utilization": "0.9",
        "--generation-config": "vllm",
    }
    bare = serve.vllm_command("/m", "m", port=1, generation_config=None, python="py")
    assert bare == [
        "py",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
        "--served-model-name",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "1",
        "--tensor-parallel-size",
        "1",
    ]


FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        data = json.dumps({"data": [{"id": sys.argv[2]}]}).encode(); self.send_response(200)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
print("fake server up", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_starts_the_command_waits_for_its_model_and_stops_it(tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    log = tmp_path / "logs" / "server.log"
    cmd = [sys.executable, str(script), str(port), "q0"]
    with serve.served(cmd, url, served_name="q0", timeout_s=30, log_path=log, poll_s=0.1) as proc:
        assert proc.poll() is None and serve.served_models(url) == ["q0"]
        with serve.served(None, url, served_name="q0", timeout_s=5) as nothing:  # the running server, as it is
            assert nothing is None
        with pytest.raises(serve.ServerError, match=re.escape(f"{url} serves ['q0'], not 'other'")):
            serve.wait_ready(url, served_name="other", timeout_s=5)
    assert proc.poll() is not None  # stopped on the way out
    assert "fake server up" in log.read_text()
    with pytest.raises(serve.ServerError, match=r"exited with status 3 before it was ready .*dead.log"):
        with serve.served(
            [sys.executable, "-c", "raise SystemExit(3)"], url, timeout_s=30, log_path=tmp_path / "dead.log"
        ):
            pass


def test_a_server_that_never_answers_fails_naming_its_address_with_the_log_tail(tmp_path):
    log_path = tmp_path / "s.log"
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with open(log_path, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", "print('loading weights', flush=True); import time; time.sleep(30)"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        with pytest.raises(serve.ServerError, match=rf"(?s){re.escape(url)} was not ready after 2 s.*loading weights"):
            serve.wait_ready(url, timeout_s=2, process=proc, log_path=log_path, poll_s=0.2)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(serve.ServerError, match=r"(?s)not ready after 0.3 s.*\(no log\)"):
        serve.wait_ready(url, timeout_s=0.3, poll_s=0.05)
