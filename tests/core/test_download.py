"""paperflow.core.download.fetch against a scripted HTTP server on 127.0.0.1.

Each test gives the server a script: one `Reply` per expected request. A request beyond the script
gets HTTP 410, which `fetch` does not retry, so a test can never loop; the count of requests the
server saw is asserted.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from paperflow.core.download import ChecksumMismatch, DownloadError, fetch, sha256_file

PAYLOAD = bytes(range(256)) * 1024  # 256 KiB, several read chunks
PAYLOAD_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
FAST = {"backoff_s": 0.01, "timeout_s": 5.0, "progress": False}


@dataclass(frozen=True)
class Reply:
    """What the server does for one request."""

    status: int = 200
    honour_range: bool = True  # answer `Range: bytes=N-` with 206; else send the whole file
    drop_after: int | None = None  # close the connection after this many body bytes
    stall_s: float = 0.0  # wait this long before answering


class ScriptedServer:
    """A threaded HTTP server serving PAYLOAD at every path, one scripted `Reply` per request."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def url(self, path: str = "/data.bin") -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}{path}"

    def range_headers(self) -> list[str | None]:
        return [headers.get("Range") for headers in self.requests]

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def _next_reply(self, headers: dict[str, str]) -> Reply | None:
        with self._lock:
            self.requests.append(headers)
            return self.script.pop(0) if self.script else None

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                reply = server._next_reply(dict(self.headers.items()))
                if reply is None:
                    self.send_error(410, "script exhausted")
                    return
                time.sleep(reply.stall_s)
                if reply.status != 200:
                    self.send_error(reply.status)
                    return
                start = _range_start(self.headers.get("Range")) if reply.honour_range else None
                body = PAYLOAD[start or 0 :]
                self.send_response(206 if start is not None else 200)
                if start is not None:
                    self.send_header("Content-Range", f"bytes {start}-{len(PAYLOAD) - 1}/{len(PAYLOAD)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: reply.drop_after])
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def _range_start(header: str | None) -> int | None:
    match = re.fullmatch(r"bytes=(\d+)-", header or "")
    return int(match.group(1)) if match else None


@pytest.fixture
def server():
    with ScriptedServer() as running:
        yield running


def test_good_file_is_written_and_a_second_call_makes_no_request(server, tmp_path):
    dest = tmp_path / "nested" / "dir" / "data.bin"
    server.script = [Reply()]

    assert fetch(server.url(), dest, PAYLOAD_SHA256, **FAST) == dest
    assert dest.read_bytes() == PAYLOAD
    assert sha256_file(dest) == PAYLOAD_SHA256
    assert not (tmp_path / "nested" / "dir" / "data.bin.part").exists()

    assert fetch(server.url(), dest, PAYLOAD_SHA256.upper(), **FAST) == dest
    assert len(server.requests) == 1


def test_wrong_checksum_raises_and_leaves_nothing(server, tmp_path):
    dest = tmp_path / "data.bin"
    wrong = "0" * 64
    server.script = [Reply()]

    with pytest.raises(ChecksumMismatch) as caught:
        fetch(server.url(), dest, wrong, **FAST)

    message = str(caught.value)
    assert server.url() in message and str(dest) in message
    assert wrong in message and PAYLOAD_SHA256 in message
    assert list(tmp_path.iterdir()) == []
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [500, 503, 429])
def test_transient_status_is_retried_then_succeeds(server, tmp_path, caplog, status):
    dest = tmp_path / "data.bin"
    server.script = [Reply(status=status), Reply(status=status), Reply()]

    with caplog.at_level(logging.INFO, logger="paperflow.download"):
        fetch(server.url(), dest, PAYLOAD_SHA256, **FAST)

    assert dest.read_bytes() == PAYLOAD
    assert len(server.requests) == 3
    failures = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(failures) == 2 and all(str(status) in r.getMessage() for r in failures)


def test_persistent_server_error_gives_up_naming_url_attempts_and_error(server, tmp_path):
    dest = tmp_path / "data.bin"
    server.script = [Reply(status=502)] * 3

    with pytest.raises(DownloadError) as caught:
        fetch(server.url(), dest, PAYLOAD_SHA256, retries=2, **FAST)

    message = str(caught.value)
    assert server.url() in message and "3 attempts" in message and "502" in message
    assert not isinstance(caught.value, ChecksumMismatch)
    assert len(server.requests) == 3
    assert not dest.exists()


def test_not_found_is_not_retried(server, tmp_path):
    server.script = [Reply(status=404)] * 4

    with pytest.raises(DownloadError, match="404") as caught:
        fetch(server.url("/missing.bin"), tmp_path / "data.bin", PAYLOAD_SHA256, **FAST)

    assert server.url("/missing.bin") in str(caught.value)
    assert len(server.requests) == 1


def test_dropped_connection_resumes_with_range(server, tmp_path):
    dest = tmp_path / "data.bin"
    cut = 100_000
    server.script = [Reply(drop_after=cut), Reply()]

    fetch(server.url(), dest, PAYLOAD_SHA256, **FAST)

    assert server.range_headers() == [None, f"bytes={cut}-"]
    assert dest.read_bytes() == PAYLOAD


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    dest = tmp_path / "data.bin"
    server.script = [Reply(drop_after=100_000), Reply(honour_range=False)]

    fetch(server.url(), dest, PAYLOAD_SHA256, **FAST)

    assert server.range_headers() == [None, "bytes=100000-"]
    assert dest.read_bytes() == PAYLOAD


def test_partial_file_from_an_earlier_run_is_resumed(server, tmp_path):
    dest = tmp_path / "data.bin"
    (tmp_path / "data.bin.part").write_bytes(PAYLOAD[:4096])
    server.script = [Reply()]

    fetch(server.url(), dest, PAYLOAD_SHA256, **FAST)

    assert server.range_headers() == ["bytes=4096-"]
    assert dest.read_bytes() == PAYLOAD


def test_timeout_is_retried(server, tmp_path):
    dest = tmp_path / "data.bin"
    server.script = [Reply(stall_s=1.0), Reply()]

    fetch(server.url(), dest, PAYLOAD_SHA256, backoff_s=0.01, timeout_s=0.2, progress=False)

    assert dest.read_bytes() == PAYLOAD
    assert len(server.requests) == 2


def test_wrong_existing_file_is_replaced(server, tmp_path):
    dest = tmp_path / "data.bin"
    dest.write_bytes(b"stale")
    server.script = [Reply()]

    fetch(server.url(), dest, PAYLOAD_SHA256, **FAST)

    assert dest.read_bytes() == PAYLOAD
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "g" * 64, "0" * 63, "0" * 65, None, "md5:" + "0" * 31, "sha1:" + "0" * 40, "sha256-prefix:0676ba6"],
)
def test_invalid_sha256_argument_is_rejected_before_any_request(server, tmp_path, bad):
    with pytest.raises(ValueError, match="sha256"):
        fetch(server.url(), tmp_path / "data.bin", bad, **FAST)
    assert server.requests == []


@pytest.mark.parametrize("progress, shown", [(True, True), (None, False)])
def test_progress_bar_only_when_forced_or_on_a_terminal(server, tmp_path, capsys, progress, shown):
    server.script = [Reply()]

    fetch(server.url(), tmp_path / "data.bin", PAYLOAD_SHA256, backoff_s=0.01, timeout_s=5.0, progress=progress)

    assert ("data.bin" in capsys.readouterr().err) == shown


PAYLOAD_MD5 = hashlib.md5(PAYLOAD).hexdigest()


@pytest.mark.parametrize(
    "checksum, label",
    [
        ("sha256:" + PAYLOAD_SHA256.upper(), "sha256"),
        ("md5:" + PAYLOAD_MD5, "publisher's md5"),
        ("sha256-prefix:" + PAYLOAD_SHA256[:8], "sha256 prefix"),
    ],
)
def test_labelled_checksum_kinds_verify_and_say_which(server, tmp_path, caplog, checksum, label):
    server.script = [Reply()]
    with caplog.at_level(logging.INFO, logger="paperflow.download"):
        fetch(server.url(), tmp_path / "data.bin", checksum, **FAST)
    assert (tmp_path / "data.bin").read_bytes() == PAYLOAD
    assert f"({label}" in caplog.text and "verified" in caplog.text
    # a second call checks the file on disk with the same kind and makes no request
    fetch(server.url(), tmp_path / "data.bin", checksum, **FAST)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "checksum, label, actual",
    [
        ("md5:" + "0" * 32, "publisher's md5 mismatch", PAYLOAD_MD5),
        ("sha256-prefix:" + "0" * 8, "sha256 prefix (torch.hub file name) mismatch", PAYLOAD_SHA256),
    ],
)
def test_labelled_checksum_mismatch_names_the_kind_and_leaves_nothing(server, tmp_path, checksum, label, actual):
    server.script = [Reply()]
    with pytest.raises(ChecksumMismatch) as caught:
        fetch(server.url(), tmp_path / "data.bin", checksum, **FAST)
    assert label in str(caught.value) and actual in str(caught.value)
    assert list(tmp_path.iterdir()) == []
