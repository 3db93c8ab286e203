"""An OpenAI-compatible HTTP server on 127.0.0.1 for offline tests of code that talks to a vLLM server (the kit's
`paperflow.core.lm.serve.Client` and the papers built on it). It serves one model name, records every POST body and
its headers, can fail its first POSTs (a server warming up, a rate limit), and answers through a function the test
gives, so that each test scripts only what its model would say.

    with FakeOpenAI(answer) as server:        # answer(path, body) -> list of choice dicts
        client = serve.Client(server.url, server.name)

`routes` adds endpoints outside the OpenAI API (vLLM's /collective_rpc, /reset_prefix_cache): a POST to one of
those paths is answered by routes[path](body) as the whole response document, with no model-name check.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Answer = Callable[[str, dict], list[dict]]


def echo(path: str, body: dict) -> list[dict]:
    """n choices that echo the prompt (or the last chat message) followed by the choice index."""
    n = body.get("n", 1)
    if path.endswith("/chat/completions"):
        last = body["messages"][-1]["content"]
        return [{"index": j, "message": {"role": "assistant", "content": f"{last} {j}"}} for j in range(n)]
    return [{"index": j, "text": f"{body['prompt']} {j}", "finish_reason": "stop"} for j in range(n)]


def chat_choices(texts: list[str]) -> list[dict]:
    """Chat-completion choices carrying `texts`, in index order."""
    return [{"index": i, "message": {"role": "assistant", "content": t}} for i, t in enumerate(texts)]


class FakeOpenAI:
    """GET .../models lists `name`; a POST fails while `fail` > 0 (with `fail_code`), is refused with 404 for
    another model name, and otherwise answers {"choices": answer(path, body)}. An AssertionError raised by
    `answer` (an unscripted request) becomes a 500 whose message names it, so the client's error shows it."""

    def __init__(
        self,
        answer: Answer = echo,
        name: str = "m",
        fail: int = 0,
        fail_code: int = 503,
        routes: Mapping[str, Callable[[dict], dict]] | None = None,
    ):
        self.answer, self.name, self.fail, self.fail_code = answer, name, fail, fail_code
        self.routes = dict(routes or {})
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, doc: dict):
                data = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": fake.name, "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.bodies.append(body)
                    fake.headers.append(dict(self.headers))
                    fake.paths.append(self.path)
                    failing = fake.fail > 0
                    fake.fail -= failing
                if failing:
                    return self._send(fake.fail_code, {"error": "warming up"})
                if self.path in fake.routes:
                    try:
                        return self._send(200, fake.routes[self.path](body))
                    except AssertionError as e:
                        return self._send(500, {"error": f"unscripted request: {e}"})
                if body.get("model") != fake.name:
                    return self._send(404, {"error": f"model {body.get('model')} not served"})
                try:
                    choices = fake.answer(self.path, body)
                except AssertionError as e:
                    return self._send(500, {"error": f"unscripted request: {e}"})
                self._send(200, {"choices": choices})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = self.root + "/v1"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeOpenAI:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
