"""Shared fixtures: the repository root, a scratch copy of the repository, and a Snakemake runner; the
split of the suite over pytest-xdist workers.

`make test` runs `pytest -n $(CORES)` with `--dist loadgroup` (pyproject). Every test works in its own
scratch copy or tmp_path, so tests may run in any worker; a test module whose tests share an expensive
module-scoped fixture (a real Snakemake run, the SLURM cluster, a trained model) sets a module-level
`pytestmark = pytest.mark.xdist_group("<name>")`, and one worker runs the whole module, building the
fixture once. pytest-xdist 3.8.0 cannot see those marks under pytest 9.2 (it tags node ids, and pytest
9.2 no longer lets it: pytest-xdist#1386), so `pytest_xdist_make_scheduler` below reads them from the
test files' source instead. Marks on single functions or classes are not read.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from xdist.scheduler import LoadScopeScheduling

if TYPE_CHECKING:
    from xdist.remote import Producer

ROOT = Path(__file__).resolve().parents[1]
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def split_cores_between_workers() -> tuple[str, ...]:
    """Under pytest-xdist, give each worker's numeric libraries its share of the cores (unless the user set a
    thread count), so that two workers on two cores do not each start two torch threads. Returns the variables
    set here. They reach torch and the libraries loaded after this conftest; numpy's BLAS, loaded before it by
    the zarr and fast-array-utils pytest plugins, keeps its own count."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return ()
    share = str(max(1, (os.cpu_count() or 1) // workers))
    unset = tuple(var for var in THREAD_VARS if var not in os.environ)
    os.environ.update(dict.fromkeys(unset, share))
    return unset


WORKER_THREAD_VARS = split_cores_between_workers()


@cache
def module_group(path: Path) -> str | None:
    """The name of the `xdist_group` mark in the module-level `pytestmark` of test file `path`, or None."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if not (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)):
            continue
        for call in ast.walk(node.value):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "xdist_group":
                names = [*call.args, *(k.value for k in call.keywords if k.arg == "name")]
                if names and isinstance(names[0], ast.Constant):
                    return str(names[0].value)
    return None


class ModuleGroupScheduling(LoadScopeScheduling):
    """Load scheduling with one work unit per test, except that every test of a module marked with an
    `xdist_group` goes, with the rest of its group, to one worker."""

    def _split_scope(self, nodeid: str) -> str:
        path = Path(self.config.rootpath, nodeid.split("::", 1)[0])
        group = module_group(path) if path.suffix == ".py" and path.is_file() else None
        return f"group:{group}" if group else nodeid


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadScopeScheduling | None:
    """`--dist loadgroup` with the groups read from the test modules (see the module docstring)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return ModuleGroupScheduling(config, log)


COPY_IGNORE = shutil.ignore_patterns(
    ".venv", "results", "resources", ".snakemake", ".git", "__pycache__", "*.egg-info", ".pytest_cache", "report.html"
)


def snakemake_bin() -> str:
    return str(Path(sys.executable).with_name("snakemake"))


def run_snakemake(workdir: Path, *args: str, check: bool = True, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the real Snakemake CLI in `workdir` (a checkout); return the completed process."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)  # the workflow itself must make paperflow importable for its jobs
    for var in WORKER_THREAD_VARS:  # jobs size their own threads (core.job), as in a run outside pytest
        env.pop(var)
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
    returns (base URL, list of requested paths); the servers stop when the test ends. `payload` may be a dict
    whose "payload" the test changes between requests (a publisher replacing a file)."""
    import http.server
    import threading

    servers = []

    def start(payload: bytes | dict) -> tuple[str, list[str]]:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                body = payload["payload"] if isinstance(payload, dict) else payload
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", hits

    yield start
    for httpd in servers:
        httpd.shutdown()
