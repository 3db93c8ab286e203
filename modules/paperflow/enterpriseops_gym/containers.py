"""The official domain servers at paper scale, started inside the train job with Apptainer (no Docker daemon).

Each server the job's tasks name (`official.servers` gives its URL) runs as `apptainer run docker://<image>@<digest>`
(`official.containers.images.<server>`: image, digest, and optional env, args and health path), its output in
`<log_dir>/<server>.log`. The block runs once every server answers HTTP at its URL (any status below 500: the MCP
endpoint answers a bare GET with 4xx); every server is stopped when the block ends, on failure too. A server without
a digest is refused before anything starts, naming its key: a tag such as `latest` moves, so it is never run.
With `official.containers.start` false the servers are the user's (started by hand) and only health-checked.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from paperflow.core.config import ConfigError
from paperflow.core.lm.serve import stop_process

log = logging.getLogger(__name__)

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
KEY = "official.containers.images"


class ServerStartError(RuntimeError):
    """A domain server exited before answering, or did not answer within the startup timeout."""


def image_ref(server: str, spec: Mapping[str, Any]) -> str:
    """`docker://<image>@sha256:<digest>`; a missing or malformed digest is a ConfigError naming the key."""
    digest = spec.get("digest")
    if not digest:
        raise ConfigError(
            f"{KEY}.{server}.digest is null: the image {spec.get('image')!r} is not pinned; set its sha256 digest "
            "(`docker buildx imagetools inspect <image>:latest` or `skopeo inspect`) before running paper scale"
        )
    if not DIGEST.match(str(digest)):
        raise ConfigError(f"{KEY}.{server}.digest = {digest!r}: expected sha256:<64 hex digits>")
    return f"docker://{spec['image']}@{digest}"


def apptainer_command(server: str, spec: Mapping[str, Any], apptainer: str = "apptainer") -> list[str]:
    """The command line that runs one domain server in the foreground (its environment cleaned, a writable tmpfs over
    the read-only image for the server's own files)."""
    cmd = [apptainer, "run", "--cleanenv", "--writable-tmpfs"]
    for key, value in sorted((spec.get("env") or {}).items()):
        cmd += ["--env", f"{key}={value}"]
    cmd += [str(a) for a in spec.get("args") or []]
    return [*cmd, image_ref(server, spec)]


def commands(containers: Mapping[str, Any], servers: Sequence[str]) -> dict[str, list[str]]:
    """Every named server's command line; each server needs an image entry and a digest (checked before any start)."""
    images = containers.get("images") or {}
    missing = [s for s in servers if s not in images]
    if missing:
        raise ConfigError(f"{KEY} has no image for server(s) {missing}; known: {sorted(images)}")
    app = str(containers.get("apptainer", "apptainer"))
    return {s: apptainer_command(s, images[s], app) for s in servers}


def planned(containers: Mapping[str, Any] | None, servers: Sequence[str]) -> dict[str, str]:
    """What the train job will run per server, for the DAG (the rule's params): the command line, or why the job
    will refuse it (an unpinned image); {} when the servers are the user's."""
    containers = containers or {}
    if not containers.get("start"):
        return {}
    app = str(containers.get("apptainer", "apptainer"))
    images = containers.get("images") or {}
    out = {}
    for server in servers:
        try:
            out[server] = shlex.join(apptainer_command(server, images[server], app))
        except (ConfigError, KeyError) as err:
            out[server] = f"refused: {err}"
    return out


def answers(url: str, timeout_s: float = 5.0) -> bool:
    """True when an HTTP server answers at `url` with a status below 500."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (loopback server URLs)
            return response.status < 500
    except urllib.error.HTTPError as err:
        return err.code < 500
    except (urllib.error.URLError, OSError):
        return False


def health_url(url: str, spec: Mapping[str, Any] | None) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{(spec or {}).get('health', '/')}"


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_healthy(
    urls: Mapping[str, str], processes: Mapping[str, subprocess.Popen], logs: Mapping[str, Path], timeout_s: float
) -> float:
    """Poll every server until it answers; the seconds waited. ServerStartError when one exits or time runs out."""
    start = time.monotonic()
    pending = dict(urls)
    wait = 0.1
    while pending:
        for server, url in list(pending.items()):
            proc = processes.get(server)
            if proc is not None and proc.poll() is not None:
                raise ServerStartError(
                    f"domain server {server} exited with {proc.returncode} before answering at {url}; "
                    f"log {logs.get(server)}:\n{_tail(logs[server]) if server in logs else ''}"
                )
            if answers(url):
                log.info("domain server %s answers at %s", server, url)
                del pending[server]
        if not pending:
            break
        if time.monotonic() - start > timeout_s:
            raise ServerStartError(f"domain server(s) {sorted(pending)} did not answer within {timeout_s:.0f} s")
        time.sleep(wait)
        wait = min(2 * wait, 2.0)
    return time.monotonic() - start


def _stop(server: str, proc: subprocess.Popen, timeout_s: float) -> None:
    if proc.poll() is None:
        log.info("stopping domain server %s", server)
        stop_process(proc, timeout_s)


@contextmanager
def domain_servers(
    containers: Mapping[str, Any] | None,
    urls: Mapping[str, str],
    needed: Sequence[str],
    log_dir: str | Path,
) -> Iterator[dict[str, list[str]]]:
    """The servers in `needed` up for the block (see the module docstring); yields their command lines ({} when the
    servers are the user's). `urls` is `official.servers`."""
    containers = containers or {}
    needed = sorted(set(needed))
    unknown = [s for s in needed if s not in urls]
    if unknown:
        raise ConfigError(f"official.servers has no URL for server(s) {unknown}; known: {sorted(urls)}")
    images = containers.get("images") or {}
    checks = {s: health_url(urls[s], images.get(s)) for s in needed}
    timeout_s = float(containers.get("startup_timeout_s", 600))
    if not containers.get("start", False):
        wait_healthy(checks, {}, {}, timeout_s)
        yield {}
        return
    cmds = commands(containers, needed)  # every digest checked before the first start
    busy = [s for s in needed if answers(checks[s], timeout_s=2)]
    if busy:
        raise ServerStartError(f"something already answers at the URL of {busy}: {[urls[s] for s in busy]}")
    folder = Path(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    logs = {s: folder / f"{s}.log" for s in needed}
    stop_s = float(containers.get("stop_timeout_s", 30))
    with ExitStack() as stack:
        processes: dict[str, subprocess.Popen] = {}
        for server in needed:
            sink = stack.enter_context(open(logs[server], "ab"))  # noqa: SIM115 (closed by the stack)
            log.info("starting domain server %s: %s", server, shlex.join(cmds[server]))
            # in the job's process group, so that a job killed from outside takes its servers with it
            proc = subprocess.Popen(cmds[server], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            processes[server] = proc
            stack.callback(_stop, server, proc, stop_s)
        waited = wait_healthy(checks, processes, logs, timeout_s)
        log.info("%d domain server(s) up after %.1f s", len(needed), waited)
        yield cmds


def needed_servers(tasks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The server names the tasks' gym_servers_config give."""
    return sorted({g["mcp_server_name"] for t in tasks for g in t["gym_servers_config"]})
