"""Shared fixtures: the repository root, a scratch copy of the repository, and a Snakemake runner."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPY_IGNORE = shutil.ignore_patterns(
    ".venv", "results", "resources", ".snakemake", ".git", "__pycache__", "*.egg-info", ".pytest_cache", "report.html"
)


def snakemake_bin() -> str:
    return str(Path(sys.executable).with_name("snakemake"))


def run_snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real Snakemake CLI in `workdir` (a checkout); return the completed process."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # the workflow itself must make paperflow importable for its jobs
    proc = subprocess.run(
        [snakemake_bin(), *args], cwd=workdir, capture_output=True, text=True, env=env, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a Snakemake (dry) run: rule name -> number of jobs."""
    counts: dict[str, int] = {}
    if "Job stats:" not in output:
        return counts
    table = output.split("Job stats:", 1)[1]
    for line in table.splitlines()[3:]:
        match = re.match(r"^(\S+)\s+(\d+)$", line.strip())
        if not match:
            break
        if match.group(1) != "total":
            counts[match.group(1)] = int(match.group(2))
    return counts


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


def copy_repo(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=COPY_IGNORE)
    return dest


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A scratch copy of the checkout (sources and config only) that a test may edit."""
    return copy_repo(tmp_path / "repo")


@pytest.fixture(scope="session")
def dry_repo(tmp_path_factory) -> Path:
    """A scratch copy for dry runs and lint: never sees the developer's own results/ or locks."""
    return copy_repo(tmp_path_factory.mktemp("dry") / "repo")


@pytest.fixture
def serve_bytes():
    """A loopback HTTP server for download tests: `serve_bytes(payload)` serves `payload` at every path and
    returns (base URL, list of requested paths); the servers stop when the test ends."""
    import http.server
    import threading

    servers = []

    def start(payload: bytes) -> tuple[str, list[str]]:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", hits

    yield start
    for httpd in servers:
        httpd.shutdown()
