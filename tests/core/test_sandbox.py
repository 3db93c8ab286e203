"""Hostile programs against the core sandbox (paperflow.core.sandbox), graded the way promptscale grades model-written
code (paperflow.promptscale.code_eval.grade): each attack must be contained, graded as a failure and finish within
its timeout plus a small margin. Needs bubblewrap: skipped where it cannot run, failed instead when
PAPERFLOW_REQUIRE_BWRAP=1 (CI installs it in .ci/run)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from paperflow.core import sandbox
from paperflow.promptscale import code_eval

WHY = sandbox.unavailable("bwrap")
if WHY and os.environ.get("PAPERFLOW_REQUIRE_BWRAP") == "1":
    raise RuntimeError(f"PAPERFLOW_REQUIRE_BWRAP=1 but the bwrap sandbox cannot run: {WHY}")
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"bubblewrap sandbox unavailable here: {WHY}")

TIMEOUT = 1.0
MARGIN = 3.0  # start-up and teardown on two loaded cores
LIMITS = {"timeout_s": TIMEOUT, "memory_mb": 1024, "isolation": "bwrap"}


def graded(code: str, expected: str, stdin: str = "") -> tuple[dict, float]:
    row = {"id": "hostile", "fn_name": None, "tests": [{"input": stdin, "output": expected, "testtype": "stdin"}]}
    start = time.monotonic()
    got = code_eval.grade(f"```python\n{code}\n```", row, LIMITS)
    wall = time.monotonic() - start
    assert wall < TIMEOUT + MARGIN, f"took {wall:.1f} s"
    return got, wall


def failed(got: dict, *statuses: str) -> bool:
    return not got["passed"] and (not statuses or got["status"] in statuses)


def survivors(marker: str) -> list[int]:
    """Processes whose command line holds `marker`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_correct_program_passes_and_the_working_folder_and_tmp_are_writable():
    code = "open('scratch', 'w').write('x'); open('/tmp/t', 'w').write('y')\na, b = map(int, input().split())\nprint(a + b)"
    got, _ = graded(code, "5", "2 3\n")
    assert got["passed"]
    ran = sandbox.run([sys.executable, "-I", "p.py"], {"p.py": "print(1)"}, "", sandbox.Limits(1, 512), "bwrap")
    assert (ran.status, ran.text, ran.isolation) == ("ok", "1\n", "bwrap")


def test_files_outside_the_sandbox_cannot_be_read(tmp_path):
    hidden = tmp_path / "hidden_tests.jsonl"
    hidden.write_text("the-answer-42")
    repo_file = os.path.abspath(__file__)  # the checkout: not mounted
    got, _ = graded(f"print(open({str(hidden)!r}).read())", "the-answer-42")
    assert failed(got, "error")
    got, _ = graded(f"print(open({repo_file!r}).read()[:3])", open(repo_file).read()[:3])
    assert failed(got, "error")


def test_nothing_outside_the_sandbox_can_be_written(tmp_path):
    targets = [str(tmp_path / "pwned"), os.path.join(sys.prefix, "pwned"), "/usr/pwned", "/etc/pwned"]
    code = "import sys\nok = 0\nfor t in %r:\n    try:\n        open(t, 'w').write('x'); ok += 1\n    except OSError:\n        pass\nprint(ok)"
    got, _ = graded(code % targets, "0")  # the control: every write refused...
    assert got["passed"]
    got, _ = graded(code % targets, "4")  # ...so the attack's output is wrong
    assert failed(got, "wrong")
    assert not any(os.path.exists(t) for t in targets)


def test_a_fork_bomb_is_held_by_the_process_limit_and_leaves_nothing():
    marker = f"{time.time():.6f}"
    code = (
        "import os\nwhile True:\n    try:\n        pid = os.fork()\n    except OSError:\n        continue\n"
        f"    if pid == 0:\n        os.execv('/bin/sleep', ['sleep', '{marker}'])"
    )
    got, _ = graded(code, "x")
    assert failed(got, "timeout", "error")
    time.sleep(0.2)
    assert survivors(f"sleep\0{marker}") == []


def test_an_8_gb_allocation_is_a_memory_failure():
    got, _ = graded("b = bytearray(8 << 30)\nprint(len(b))", str(8 << 30))
    assert failed(got, "memory")


def test_an_infinite_loop_is_killed_at_the_timeout():
    got, wall = graded("while True:\n    pass", "x")
    assert failed(got, "timeout") and wall >= TIMEOUT


def test_a_setsid_grandchild_that_sleeps_neither_holds_the_grader_nor_survives():
    marker = f"{time.time() + 1:.6f}"
    code = (
        "import os\nif os.fork() == 0:\n    os.setsid()\n"
        f"    os.execv('/bin/sleep', ['sleep', '{marker}'])\nprint('parent done')"
    )
    got, wall = graded(code, "never")
    assert failed(got, "wrong") and wall < TIMEOUT  # the sandbox ended with its program: no wait for the pipe
    time.sleep(0.2)
    assert survivors(f"sleep\0{marker}") == []


def test_the_hosts_loopback_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
    got, _ = graded(code, "connected")
    server.setblocking(False)
    with pytest.raises(BlockingIOError):  # no connection is waiting
        server.accept()
    server.close()
    assert failed(got, "error")


def test_no_environment_of_the_grader_is_visible(monkeypatch):
    token = f"hf_{uuid.uuid4().hex}"
    monkeypatch.setenv("FAKE_HF_TOKEN", token)
    code = (
        "import os\nfound = [v for v in os.environ.values() if v.startswith('hf_')]\n"
        "for pid in ['self', str(os.getppid()), '1'] + [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n        found += [e.decode() for e in open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0')"
        " if b'hf_' in e]\n    except OSError:\n        pass\nprint(found[0].split('=')[-1])"
    )
    got, _ = graded(code, token)
    assert failed(got, "error")


def test_a_sibling_of_the_sandbox_cannot_be_killed():
    sibling = subprocess.Popen(["sleep", "60"])  # stands in for the vLLM server beside the grader
    try:
        code = f"import os, signal\nos.kill({sibling.pid}, signal.SIGKILL)\nprint('killed')"
        got, _ = graded(code, "killed")
        assert failed(got, "error")
        got, _ = graded("import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('killed')", "killed")
        assert sibling.poll() is None
    finally:
        sibling.kill()
        sibling.wait()


def test_200_mb_of_output_stops_at_the_cap():
    code = "import sys\nfor _ in range(200):\n    sys.stdout.write('x' * (1 << 20))"
    got, _ = graded(code, "x")
    assert failed(got, "output_limit")
    cap = 1 << 20
    limits = sandbox.Limits(timeout_s=TIMEOUT, memory_mb=512, output_bytes=cap)
    ran = sandbox.run([sys.executable, "-I", "p.py"], {"p.py": code}, "", limits, "bwrap")
    assert ran.status == "output_limit" and len(ran.stdout) + len(ran.stderr) <= cap + (1 << 16)


def test_odd_tokens_and_bytes_are_a_failed_test_never_a_grader_exception():
    for printed, expected in [
        ("sNaN", "1"),
        ("-sNaN sNaN7", "0 0"),
        ("NaN", "nan"),
        ("1e999999999", "1"),
        ("Infinity", "2"),
        ("1_0", "11"),
    ]:
        got, _ = graded(f"print({printed!r})", expected)
        assert failed(got, "wrong"), printed
    got, _ = graded("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe 1\\n')", "1")
    assert failed(got, "wrong")
    row = {"id": "f", "fn_name": "f", "tests": [{"input": "1", "output": "1", "testtype": "functional"}]}
    for value in ("10 ** 5000", "float('nan')", "[[[[1]]]]"):
        code = (
            f"import sys\nsys.set_int_max_str_digits(0)\nclass Solution:\n    def f(self, a):\n        return {value}"
        )
        assert failed(code_eval.grade(f"```python\n{code}\n```", row, LIMITS), "wrong"), value


def test_no_descriptor_of_the_grader_is_inherited():
    code = "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
    ran = sandbox.run([sys.executable, "-I", "p.py"], {"p.py": code}, "", sandbox.Limits(TIMEOUT, 512), "bwrap")
    assert ran.status == "ok" and ran.text.strip() == "[0, 1, 2, 3]"  # 3: the listing's own


def test_bwrap_where_it_cannot_run_is_refused_by_name_and_rlimits_is_named_in_the_result(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.unavailable.cache_clear()
    try:
        with pytest.raises(
            sandbox.SandboxUnavailable, match=r"code_eval.isolation = bwrap: bubblewrap .* not installed"
        ):
            code_eval.preflight(LIMITS)
        code_eval.preflight({**LIMITS, "isolation": "rlimits"})  # the weaker isolation, accepted by name
    finally:
        sandbox.unavailable.cache_clear()
    ran = sandbox.run([sys.executable, "-I", "p.py"], {"p.py": "print(2)"}, "", sandbox.Limits(TIMEOUT, 512), "rlimits")
    assert (ran.status, ran.text, ran.isolation) == ("ok", "2\n", "rlimits")
