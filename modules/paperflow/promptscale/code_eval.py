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
run_test      one test in the core sandbox (paperflow.core.sandbox: `python -I` in a fresh folder holding only the
              program; `isolation` bwrap, or rlimits where the config accepts less), `timeout_s` of wall clock and
              `memory_mb` of address space per process; a status other than ok is the test's failure
grade         a completion passes when every test passes (stopping at the first failure), as LiveCodeBench grades
pass_at_1     LiveCodeBench's pass@1 from n samples per problem: the mean over problems of c / n, in percent

Stdin tests compare outputs line by line after stripping, a line matching when equal or when its tokens are equal
numbers (NaN and sNaN tokens match only as equal text); functional tests call `Solution().<func_name>(*args)` with
the JSON arguments (one per input line) and compare the JSON value returned (tuples as lists) with the expected one,
the program's own prints discarded. Whatever a program writes, comparing it never raises into the grader: output
that cannot be compared is that test's failure ("wrong").

evaluate_code and code_selfplay.verify append each problem's result to `<out>.partial` (after a first line holding the
key of the job's inputs) as soon as the problem is graded; a rerun of the same job keeps those and grades only the
rest, so a crash or a kill loses at most the problems in flight. The file is removed when `out` is written. At paper
scale the rules pass `journal` (a file in the job's checkpoint folder, README "Long jobs resume"), and the graded
problems go there instead (`JournalProgress`), with evaluate_code's samples (vllm_server.chat_each), so a rerun
neither samples nor grades again what was done.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
import sys
import zlib
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from paperflow.core import sandbox

LIMIT_KEYS = ("timeout_s", "memory_mb", "isolation")

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

# The value returned goes to the real stdout; the program's own prints (fd 1) go to /dev/null.
FUNCTIONAL_RUNNER = """import json, os, sys
result = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
namespace = {"__name__": "solution"}
exec(compile(open("header.py").read() + open("solution.py").read(), "solution.py", "exec"), namespace)
args = [json.loads(line) for line in sys.stdin.read().split("\\n") if line.strip()]
value = getattr(namespace["Solution"](), sys.argv[1])(*args)
sys.stdout.flush()
json.dump(value, result)
result.close()
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
    if limits["isolation"] not in sandbox.ISOLATIONS:
        raise ValueError(f"{where}.isolation = {limits['isolation']!r}: allowed {sandbox.ISOLATIONS}")
    return dict(limits)


def _run(argv: list[str], files: Mapping[str, str], stdin: str, limits: Mapping[str, Any]) -> tuple[str, str]:
    """(status, stdout): status ok, error (non-zero exit), timeout, memory or output_limit."""
    got = sandbox.run(
        argv,
        files,
        stdin,
        sandbox.Limits(timeout_s=float(limits["timeout_s"]), memory_mb=int(limits["memory_mb"])),
        limits["isolation"],
    )
    return got.status, got.text


def _number(token: str) -> Decimal | None:
    try:
        value = Decimal(token)
    except (InvalidOperation, ValueError, ArithmeticError):
        return None
    return None if value.is_nan() else value  # NaN and sNaN compare as text only (sNaN would raise)


def same_stdout(got: str, expected: str) -> bool:
    """LiveCodeBench's stdio comparison: stripped lines equal, or equal as numbers token by token. Never raises:
    output that cannot be compared does not match."""
    try:
        return _same_stdout(got, expected)
    except Exception:  # a program's output must not reach the grader as an exception
        return False


def _same_stdout(got: str, expected: str) -> bool:
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


def same_value(got_json: str, expected_json: str) -> bool:
    """A functional test's comparison: the JSON returned equals the expected JSON. Never raises (deep nesting, huge
    integers, text that is not JSON: no match)."""
    try:
        return json.loads(got_json) == json.loads(expected_json)
    except Exception:  # the returned text is the program's: anything it holds is that test's failure
        return False


def run_test(code: str, test: Mapping[str, str], fn_name: str | None, limits: Mapping[str, Any]) -> str:
    """One test: "pass", "wrong", "error", "timeout", "memory" or "output_limit"."""
    if test["testtype"] == "functional":
        files = {"header.py": HEADER, "solution.py": code, "runner.py": FUNCTIONAL_RUNNER}
        status, out = _run([sys.executable, "-I", "runner.py", str(fn_name)], files, test["input"], limits)
        if status != "ok":
            return status
        return "pass" if same_value(out, test["output"]) else "wrong"
    files = {"solution.py": HEADER + code}
    status, out = _run([sys.executable, "-I", "solution.py"], files, test["input"], limits)
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
    """The isolation the config names, checked (bwrap where bubblewrap is missing or cannot build its namespaces is
    refused naming code_eval.isolation), then a known-good program through the sandbox before any grading, so that a
    broken sandbox fails the job instead of scoring every completion 0."""
    sandbox.require(limits["isolation"], "code_eval.isolation")
    row = {"id": "preflight", "fn_name": None, "tests": [{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}]}
    got = grade("```python\na, b = map(int, input().split())\nprint(a + b)\n```", row, limits)
    if not got["passed"]:
        raise RuntimeError(
            f"the code sandbox cannot run a correct program (status {got['status']}) with code_eval = {dict(limits)}"
        )


class Progress:
    """Per-problem results of a grading job appended to `<out>.partial` as they finish: the first line is {"key":
    the job's inputs' digest}; a rerun with the same key keeps the rows there (a torn last line dropped), another key
    starts afresh. `finish` writes `out` and removes the partial file."""

    def __init__(self, out: str | os.PathLike, key: Mapping[str, Any]):
        self.out = Path(out)
        self.path = Path(f"{out}.partial")
        self.key = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        self.done: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            lines = self.path.read_bytes().split(b"\n")
            try:
                same = json.loads(lines[0]).get("key") == self.key
            except (ValueError, AttributeError):
                same = False
            for line in lines[1:] if same else []:
                try:
                    row = json.loads(line)
                except ValueError:
                    break  # a line torn by the crash, and nothing after it
                self.done[str(row["id"])] = row
        with open(self.path, "w", encoding="utf-8") as handle:  # rewritten clean: the key, then the rows kept
            handle.write(json.dumps({"key": self.key}) + "\n")
            for row in self.done.values():
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle = open(self.path, "a", encoding="utf-8")

    def add(self, row: Mapping[str, Any]) -> None:
        self.done[str(row["id"])] = dict(row)
        self._handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def finish(self, order: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows in `order` (ids), written to `out`; the partial file removed."""
        self._handle.close()
        rows = [self.done[str(i)] for i in order]
        with open(self.out, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.path.unlink()
        return rows

    def close(self) -> None:
        self._handle.close()


class JournalProgress:
    """Progress kept in a RowJournal (vllm_server.journal_at: the job's checkpoint folder, whose key, made of the job's
    rule, params, code and inputs, stands for Progress's key) instead of `<out>.partial`: each graded problem is the
    row "graded:<id>" there, its keys' order kept, so `finish` writes the bytes an uninterrupted run writes."""

    PREFIX = "graded:"

    def __init__(self, out: str | os.PathLike, journal):
        self.out = Path(out)
        self.journal = journal
        self.done: dict[str, dict[str, Any]] = {
            str(r["id"])[len(self.PREFIX) :]: {k: r["row"][k] for k in r["keys"]}
            for r in journal
            if str(r["id"]).startswith(self.PREFIX)
        }

    def add(self, row: Mapping[str, Any]) -> None:
        self.journal.append({"id": f"{self.PREFIX}{row['id']}", "keys": list(row), "row": dict(row)})
        self.done[str(row["id"])] = dict(row)

    def finish(self, order: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows in `order` (ids), written to `out` (the journal stays until the job ends)."""
        rows = [self.done[str(i)] for i in order]
        with open(self.out, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        return rows

    def close(self) -> None:
        pass  # the journal is closed by whoever opened it


def file_digest(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_stamp(folder: str | os.PathLike) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime ns) of every file under `folder`: a retrained model changes it ([] if absent)."""
    root = Path(folder)
    if not root.is_dir():
        return []
    return sorted(
        (p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    )


def grade_by_problem(
    jobs: Sequence[tuple[Any, str, Mapping[str, Any]]], limits: Mapping[str, Any], workers: int, on_problem
) -> None:
    """Grade (problem id, completion, row) jobs `workers` at a time; `on_problem(id, [grade, ...])` (in job order)
    as soon as the last job of a problem is graded."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    by_problem: dict[Any, list[int]] = {}
    for i, (ident, _, _) in enumerate(jobs):
        by_problem.setdefault(ident, []).append(i)
    left = {ident: len(ix) for ident, ix in by_problem.items()}
    results: dict[int, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=max(int(workers), 1)) as pool:
        futures = {pool.submit(grade, text, row, limits): i for i, (_, text, row) in enumerate(jobs)}
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            ident = jobs[i][0]
            left[ident] -= 1
            if not left[ident]:
                on_problem(ident, [results.pop(j) for j in by_problem[ident]])


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
    journal: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """The code evaluate rule: `llm_eval.samples` chat completions of the policy per problem, each graded in the
    sandbox (`workers` at a time); rows {"id", "status": [...], "correct": [...], "truncated": [...]}, appended per
    problem as graded (Progress: a rerun samples and grades only the problems not yet done). Returns pass@1 (as
    `avg_at_k`, the benchmark table's column, and `pass_at_1`), the share cut at max_tokens and the isolation used.
    With `journal` (a file in the job's checkpoint folder) the samples (problem i seeded `seed + i` of all problems)
    and the graded problems are kept there (`JournalProgress`) instead of `<out>.partial`."""
    from contextlib import nullcontext

    from paperflow.promptscale.llm_text import read_jsonl
    from paperflow.promptscale.vllm_server import journal_at, journalled, served

    limits = check_limits(limits, "code_eval")
    preflight(limits)
    rows = read_jsonl(benchmark_rows)
    k = int(settings["samples"])
    key = {
        "rows": file_digest(benchmark_rows),
        "policy": policy,
        "model": folder_stamp(policy_folder),
        "settings": dict(settings),
        "limits": limits,
    }
    with journal_at(journal) as done:
        progress = Progress(out, key) if done is None else JournalProgress(out, done)
        try:
            graded = _evaluate_code(
                rows,
                progress,
                done,
                k,
                settings,
                limits,
                workers,
                lambda: (
                    nullcontext()
                    if journalled(done, "sample:", len(rows))
                    else served(policy_folder, policy, vllm, server_log, dtype)
                ),
            )
        finally:
            progress.close()
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
        "isolation": limits["isolation"],
    }


def _evaluate_code(rows, progress, journal, k, settings, limits, workers, serve) -> list[dict[str, Any]]:
    """evaluate_code's sampling (`serve()`: the served policy's client) and grading of the problems `progress` has
    not done; every problem's graded row. Without a journal only those problems are sampled (seeds `seed + i` over
    them); with one every problem is asked for (seed `seed + i` over all), the journalled ones answered from it."""
    from paperflow.promptscale.vllm_server import chat_each

    todo = [r for r in rows if str(r["id"]) not in progress.done]
    if todo:
        asked = todo if journal is None else rows
        with serve() as client:
            samples = chat_each(
                client,
                [lcb_prompt(r) for r in asked],
                n=k,
                temperature=float(settings["temperature"]),
                top_p=float(settings["top_p"]),
                top_k=int(settings.get("top_k", -1)),
                max_tokens=int(settings["max_tokens"]),
                seed=int(settings["seed"]),
                journal=journal,
                tag="sample:",
            )
        by_id = {str(r["id"]): ch for r, ch in zip(asked, samples)}
        samples = [by_id[str(r["id"])] for r in todo]
        truncated = {str(r["id"]): [c["finish_reason"] == "length" for c in ch] for r, ch in zip(todo, samples)}

        def record(ident, graded):
            progress.add(
                {
                    "id": ident,
                    "status": [g["status"] for g in graded],
                    "correct": [g["passed"] for g in graded],
                    "truncated": truncated[ident],
                }
            )

        jobs = [(str(r["id"]), c["text"], r) for r, choices in zip(todo, samples) for c in choices]
        grade_by_problem(jobs, limits, workers, record)
    return progress.finish([r["id"] for r in rows])
