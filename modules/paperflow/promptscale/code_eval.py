"""LiveCodeBench at paper scale (spec 5/8: LCB v5 = problems of 2024-08..2025-01, v6 = 2025-02..2025-04, pass@1 on
the hidden tests), standard library only (the evaluate rule runs in envs/lm-serve.yaml beside the vLLM server):

lcb_rows      the release files of livecodebench/code_generation_lite (JSON lines: question_content, starter_code,
              platform, question_id, contest_date, public_test_cases, private_test_cases, metadata), streamed, kept
              when contest_date falls in the window [start, end), tests decoded: the public and the private ones
              (a JSON list, or base64 of zlib of a pickled JSON string, as the dataset stores the large ones; the
              pickle is read by an unpickler that admits nothing but its string)
lcb_prompt    the user message: the statement, then the starter code to complete (LeetCode, functional tests) or
              the instruction to read stdin and write stdout (AtCoder / Codeforces), the code in a ```python block
extract_code  the last fenced code block after the reasoning (`</think>`), '' when there is none
run_test      one test in a child process: `python -I` in an empty temporary folder, a minimal environment, CPU
              seconds, address space, file size and core dumps limited by resource.setrlimit, a wall-clock timeout
              that kills the process group, and with `network: unshare` a fresh network namespace (no interface
              but loopback) from `unshare --user --map-root-user --net`
grade         a completion passes when every test passes (stopping at the first failure), as LiveCodeBench grades
pass_at_1     LiveCodeBench's pass@1 from n samples per problem: the mean over problems of c / n, in percent

Stdin tests compare outputs line by line after stripping, a line matching when equal or when its tokens are equal
numbers; functional tests call `Solution().<func_name>(*args)` with the JSON arguments (one per input line) and
compare the JSON value returned (tuples as lists) with the expected one.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

NETWORK = ("none", "unshare")
LIMIT_KEYS = ("timeout_s", "memory_mb", "network")
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--"]

# What a solution may use without importing it (LiveCodeBench runs the code after a header of the same intent).
HEADER = """import sys, os, math, re, string, heapq, bisect, itertools, functools, collections, random, copy, operator
from typing import *
from collections import *
from itertools import *
from functools import *
from heapq import *
from bisect import *
from math import *
sys.setrecursionlimit(1 << 16)
"""

FUNCTIONAL_RUNNER = """import json, sys
namespace = {"__name__": "solution"}
exec(compile(open("header.py").read() + open("solution.py").read(), "solution.py", "exec"), namespace)
args = [json.loads(line) for line in sys.stdin.read().split("\\n") if line.strip()]
result = getattr(namespace["Solution"](), sys.argv[1])(*args)
with open("result.json", "w") as out:
    json.dump(result, out)
"""


# --- the dataset ----------------------------------------------------------------------------------------------------


class _StringOnly(pickle.Unpickler):
    def find_class(self, module, name):  # a pickled str needs no class: anything else is refused
        raise pickle.UnpicklingError(f"a test field may hold a string only, not {module}.{name}")


def decode_tests(field: Any) -> list[dict[str, str]]:
    """A test-case field: a JSON list (or its text), or base64(zlib(pickle(JSON text)))."""
    if isinstance(field, list):
        return field
    text = str(field)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    raw = _StringOnly(io.BytesIO(zlib.decompress(base64.b64decode(text.encode())))).load()
    if not isinstance(raw, str):
        raise ValueError(f"a compressed test field holds {type(raw).__name__}, not JSON text")
    return json.loads(raw)


def _records(files: Sequence[str | Path]) -> Iterator[dict[str, Any]]:
    for path in files:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)


def lcb_rows(files: Sequence[str | Path], window: Sequence[str], name: str) -> tuple[list[dict[str, Any]], int]:
    """(rows in the window, records read). A row: {"id", "platform", "contest_date", "problem", "starter_code",
    "fn_name", "tests": [{"input", "output", "testtype"}]}, public tests first."""
    start, end = (str(w) for w in window)
    rows, seen = [], 0
    for r in _records(files):
        seen += 1
        date = str(r["contest_date"])[:10]
        if not start <= date < end:
            continue
        tests = decode_tests(r["public_test_cases"]) + decode_tests(r["private_test_cases"])
        meta = r.get("metadata") or "{}"
        meta = json.loads(meta) if isinstance(meta, str) else meta
        kinds = {t["testtype"] for t in tests}
        if not tests or not kinds <= {"stdin", "functional"}:
            raise ValueError(f"{name}: problem {r['question_id']} has tests of kinds {sorted(kinds)}")
        if "functional" in kinds and not meta.get("func_name"):
            raise ValueError(f"{name}: problem {r['question_id']} has functional tests and no metadata.func_name")
        rows.append(
            {
                "id": str(r["question_id"]),
                "platform": str(r["platform"]),
                "contest_date": str(r["contest_date"]),
                "problem": str(r["question_content"]),
                "starter_code": str(r.get("starter_code") or ""),
                "fn_name": meta.get("func_name"),
                "tests": [{k: str(t[k]) for k in ("input", "output", "testtype")} for t in tests],
            }
        )
    return rows, seen


def lcb_prompt(row: Mapping[str, Any]) -> str:
    """The user message of a LiveCodeBench problem."""
    head = (
        "You will be given a programming problem. Write a correct and efficient Python 3 program that solves it "
        f"and passes all tests.\n\nQuestion: {row['problem']}\n\n"
    )
    if row["starter_code"]:
        return head + (
            "Complete the following starter code; return the answer from the method, do not read input or print. "
            f"Put your code in one block delimited as follows.\n```python\n{row['starter_code']}\n```\n"
        )
    return head + (
        "Read the input from standard input and write the answer to standard output. Put your code in one block "
        "delimited as follows.\n```python\n# YOUR CODE HERE\n```\n"
    )


# --- running code ---------------------------------------------------------------------------------------------------


def extract_code(completion: str) -> str:
    """The last fenced block after the reasoning: the lines between the last two lines holding ```."""
    lines = completion.rsplit("</think>", 1)[-1].split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1 : fences[-1]])


def check_limits(limits: Mapping[str, Any], where: str = "code_eval") -> dict[str, Any]:
    missing = [k for k in LIMIT_KEYS if k not in limits]
    unknown = [k for k in limits if k not in LIMIT_KEYS]
    if missing or unknown:
        raise ValueError(f"{where}: keys {list(LIMIT_KEYS)} needed; missing {missing}, unknown {unknown}")
    if limits["network"] not in NETWORK:
        raise ValueError(f"{where}.network = {limits['network']!r}: allowed {NETWORK}")
    return dict(limits)


def _set_limits(cpu_s: int, memory_bytes: int):
    def apply():  # in the child, before exec
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def sandbox_command(argv: Sequence[str], network: str) -> list[str]:
    """The child's command line: `argv`, inside a fresh network namespace when `network` is unshare."""
    return [*UNSHARE, *argv] if network == "unshare" else list(argv)


def _run(argv: list[str], stdin: str, folder: Path, limits: Mapping[str, Any]) -> tuple[str, str, str]:
    """(status, stdout, stderr tail): status ok, error (non-zero exit), timeout or memory."""
    timeout = float(limits["timeout_s"])
    proc = subprocess.Popen(
        sandbox_command(argv, limits["network"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=folder,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"},
        preexec_fn=_set_limits(int(timeout) + 1, int(limits["memory_mb"]) << 20),
        start_new_session=True,  # its own process group: a timeout kills what it started too
        text=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", "", ""
    if proc.returncode == -signal.SIGXCPU or proc.returncode == -signal.SIGKILL:
        return "timeout", out, err[-500:]
    if proc.returncode != 0:
        return ("memory" if "MemoryError" in err else "error"), out, err[-500:]
    return "ok", out, err[-500:]


def _number(token: str) -> Decimal | None:
    try:
        return Decimal(token)
    except InvalidOperation:
        return None


def same_stdout(got: str, expected: str) -> bool:
    """LiveCodeBench's stdio comparison: stripped lines equal, or equal as numbers token by token."""
    a = [line.strip() for line in got.strip().split("\n")]
    b = [line.strip() for line in expected.strip().split("\n")]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        xs, ys = x.split(), y.split()
        if len(xs) != len(ys):
            return False
        for s, t in zip(xs, ys):
            u, v = _number(s), _number(t)
            if s != t and (u is None or v is None or u != v):
                return False
    return True


def run_test(code: str, test: Mapping[str, str], fn_name: str | None, limits: Mapping[str, Any]) -> str:
    """One test: "pass", "wrong", "error", "timeout" or "memory"."""
    with tempfile.TemporaryDirectory(prefix="lcb-") as tmp:
        folder = Path(tmp)
        (folder / "header.py").write_text(HEADER)
        if test["testtype"] == "functional":
            (folder / "solution.py").write_text(code)
            (folder / "runner.py").write_text(FUNCTIONAL_RUNNER)
            status, _, _ = _run([sys.executable, "-I", "runner.py", str(fn_name)], test["input"], folder, limits)
            if status != "ok":
                return status
            try:
                got = json.loads((folder / "result.json").read_text())
                return "pass" if got == json.loads(test["output"]) else "wrong"
            except (OSError, json.JSONDecodeError):
                return "wrong"
        (folder / "solution.py").write_text(HEADER + code)
        status, out, _ = _run([sys.executable, "-I", "solution.py"], test["input"], folder, limits)
        if status != "ok":
            return status
        return "pass" if same_stdout(out, test["output"]) else "wrong"


def grade(completion: str, row: Mapping[str, Any], limits: Mapping[str, Any]) -> dict[str, Any]:
    """A completion against every test of its problem, stopping at the first that does not pass: {"passed",
    "status" (pass, no_code or the failing test's status), "tests_run"}."""
    code = extract_code(completion)
    if not code.strip():
        return {"passed": False, "status": "no_code", "tests_run": 0}
    for i, test in enumerate(row["tests"]):
        status = run_test(code, test, row.get("fn_name"), limits)
        if status != "pass":
            return {"passed": False, "status": status, "tests_run": i + 1}
    return {"passed": True, "status": "pass", "tests_run": len(row["tests"])}


def pass_at_1(correct: Sequence[Sequence[bool]]) -> float:
    """LiveCodeBench's pass@1 from n samples per problem (the unbiased estimator at k = 1 is c / n), mean over
    problems, percent."""
    if not correct:
        raise ValueError("pass@1 of no problem")
    return 100.0 * sum(sum(c) / len(c) for c in correct) / len(correct)


# --- the rules ------------------------------------------------------------------------------------------------------


def download_lcb(name: str, spec: Mapping[str, Any], folder: str | Path, out: str) -> dict[str, Any]:
    """A LiveCodeBench benchmark from its downloaded snapshot `folder`: each configured file checked against its
    `sha256` when the config gives one, the window's rows written to `out` (JSONL)."""
    import fnmatch
    import hashlib

    folder = Path(folder)
    files = sorted(
        p
        for p in folder.rglob("*.jsonl")
        if any(fnmatch.fnmatch(p.relative_to(folder).as_posix(), pat) for pat in spec["files"])
    )
    if not files:
        raise FileNotFoundError(f"corpora.{name}: no file of {list(spec['files'])} in {folder}")
    for path in files:
        want = (spec.get("sha256") or {}).get(path.relative_to(folder).as_posix())
        if want:
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 24), b""):
                    digest.update(block)
            if digest.hexdigest() != want:
                raise ValueError(f"corpora.{name}: {path.name} has sha256 {digest.hexdigest()}, the config pins {want}")
    rows, seen = lcb_rows(files, spec["window"], name)
    if not rows:
        raise ValueError(f"corpora.{name}: none of the {seen} problems falls in the window {list(spec['window'])}")
    with open(out, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return {"records": seen, "rows": len(rows), "tests": sum(len(r["tests"]) for r in rows)}


def preflight(limits: Mapping[str, Any]) -> None:
    """A known-good program through the sandbox before any grading, so that a node without `unshare` (or with user
    namespaces off) fails the job naming the key instead of scoring every completion 0."""
    row = {"id": "preflight", "fn_name": None, "tests": [{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}]}
    got = grade("```python\na, b = map(int, input().split())\nprint(a + b)\n```", row, limits)
    if not got["passed"]:
        raise RuntimeError(
            f"the code sandbox cannot run a correct program (status {got['status']}) with code_eval = {dict(limits)}; "
            "with network: unshare the node needs util-linux's unshare and unprivileged user namespaces"
        )


def evaluate_code(
    policy_folder: str,
    policy: str,
    benchmark_rows: str,
    benchmark: str,
    settings: Mapping[str, Any],
    limits: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    workers: int,
) -> dict[str, Any]:
    """The code evaluate rule: `llm_eval.samples` chat completions of the policy per problem, each graded in the
    sandbox (`workers` at a time); rows {"id", "status": [...], "correct": [...]}. Returns pass@1 (as `avg_at_k`,
    the benchmark table's column, and `pass_at_1`) and the share cut at max_tokens."""
    from concurrent.futures import ThreadPoolExecutor

    from paperflow.promptscale.llm_text import read_jsonl, write_jsonl
    from paperflow.promptscale.vllm_server import chat_each, served

    limits = check_limits(limits, "code_eval")
    preflight(limits)
    rows = read_jsonl(benchmark_rows)
    k = int(settings["samples"])
    with served(policy_folder, policy, vllm, server_log, dtype) as client:
        samples = chat_each(
            client,
            [lcb_prompt(r) for r in rows],
            n=k,
            temperature=float(settings["temperature"]),
            top_p=float(settings["top_p"]),
            top_k=int(settings.get("top_k", -1)),
            max_tokens=int(settings["max_tokens"]),
            seed=int(settings["seed"]),
        )
    jobs = [(r, c["text"]) for r, choices in zip(rows, samples) for c in choices]
    with ThreadPoolExecutor(max_workers=max(int(workers), 1)) as pool:
        results = list(pool.map(lambda job: grade(job[1], job[0], limits), jobs))
    graded = []
    for i, (r, choices) in enumerate(zip(rows, samples)):
        mine = results[i * k : (i + 1) * k]
        graded.append(
            {
                "id": r["id"],
                "status": [g["status"] for g in mine],
                "correct": [g["passed"] for g in mine],
                "truncated": [c["finish_reason"] == "length" for c in choices],
            }
        )
    write_jsonl(out, graded)
    score = pass_at_1([g["correct"] for g in graded])
    return {
        "policy": policy,
        "benchmark": benchmark,
        "problems": len(graded),
        "samples": k,
        "metric": "pass@1",
        "pass_at_1": score,
        "avg_at_k": score,
        "truncated": sum(sum(g["truncated"]) for g in graded) / (k * len(graded)),
    }
