"""promptscale's code self-play at paper scale, offline: the tester's answers parsed (malformed rounds and tests
counted by reason) and the rounds merged (repeats deduplicated, inputs with disagreeing outputs dropped); programs
verified in the real sandbox (right, wrong, timeout, crash, no code); chosen/rejected pairs from hand-made verified
rollouts; the whole path (tests -> rollouts -> verify -> pairs -> DPO on math and code pairs together) against the
shared fake OpenAI server and a tiny model; the paper-scale DAG with GPUs only on the vLLM rules, and without code
no code job; config errors by name."""

from __future__ import annotations

import json
import math
import re

import pytest
import test_promptscale_paper as base
from fake_openai import FakeOpenAI, chat_choices

from paperflow.core import sandbox
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.promptscale import code_selfplay as cs
from paperflow.promptscale import llm_text as lt
from paperflow.promptscale import selfplay as sp

vllm_cfg, SELFPLAY = base.vllm_cfg, base.SELFPLAY
cfg, tiny_model_folder = base.cfg, base.tiny_model_folder  # the fixtures of the paper-scale tests

# bubblewrap where it runs (CI installs it); the rlimits fallback elsewhere (tests/core/test_sandbox.py needs it)
LIMITS = {"timeout_s": 1, "memory_mb": 1024, "isolation": "rlimits" if sandbox.unavailable("bwrap") else "bwrap"}
SETTINGS = {
    "max_problems": None,
    "tester_gpus": 2,
    "tester_max_model_len": 8192,
    "rounds": 4,
    "seed": 0,
    "temperature": 0.6,
    "top_p": 1.0,
    "top_k": -1,
    "max_tokens": 128,
    "tests_per_round": 1,
    "min_tests": 2,
}


def answer(tests, think="Let me work it out.") -> str:
    return f"{think}</think>Here are the tests.\n```json\n{json.dumps(tests)}\n```\n"


def io(i, o):
    return {"input": i, "output": o}


def stdin(i, o):
    return {"input": i, "output": o, "testtype": "stdin"}


# --- parsing and merging -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "finish", "status", "tests", "bad"),
    [
        (answer([io("1 2", "3"), io("5 5\n", "10\n")]), "stop", "ok", [stdin("1 2\n", "3"), stdin("5 5\n", "10\n")], 0),
        # only the last block after the reasoning counts
        (
            "```json\n[]\n```</think>"
            + answer([io("1", "2")], think="")[8:]
            + "```json\n"
            + json.dumps([io("7", "8")])
            + "\n```",
            "stop",
            "ok",
            [stdin("7\n", "8")],
            0,
        ),
        (answer([io("1 2", "3")]), "length", "truncated", [], 0),
        ("I think the answer is 3.</think> input 1 2, output 3", "stop", "no_block", [], 0),
        ('r</think>```json\n[{"input": "1 2", "output": 3,]\n```', "stop", "bad_json", [], 0),
        ("r</think>```json\n" + json.dumps(io("1", "2")) + "\n```", "stop", "not_a_list", [], 0),
        ("r</think>```json\n[1, 2]\n```", "stop", "ok", [], 2),
        (
            answer([io("1", "2"), {"input": "1"}, io("3", 4), io(" ", "1"), {**io("4", "5"), "why": "x"}]),
            "stop",
            "ok",
            [stdin("1\n", "2")],
            4,
        ),
        ('r</think>```json\n[{"input": "1 2', "stop", "no_block", [], 0),  # an unclosed block
    ],
)
def test_the_testers_answer_is_parsed_and_malformed_rounds_and_tests_are_counted(text, finish, status, tests, bad):
    assert cs.parse_tests(text, finish) == (status, tests, bad)


def test_rounds_merge_repeats_once_and_drop_inputs_whose_outputs_disagree():
    rounds = [
        [stdin("1 2\n", "3\n"), stdin("5\n", "10")],
        [stdin("1 2  \n\n", "3"), stdin("5\n", "11")],  # the same input (trailing blanks) agreeing; 5 disagrees
        [stdin("2 2\n", "4.0"), stdin("1 2\n", "3.000")],  # numbers equal as LiveCodeBench compares them
        [stdin("2 2\n", "4"), stdin("5\n", "10")],  # 5 agrees with round 0 again: still dropped
    ]
    kept, counts = cs.merge_rounds(rounds)
    assert kept == [stdin("1 2\n", "3\n"), stdin("2 2\n", "4.0")]  # the first of each, in the order first seen
    assert counts == {"parsed": 8, "duplicate": 4, "conflicting": 1, "kept": 2}
    assert cs.merge_rounds([[stdin("1\n", "a")], [stdin("1\n", "b")]])[0] == []
    assert cs.input_key("3\n1 2 \n\n") == cs.input_key("3\n1 2") != cs.input_key("3\n12")


def test_problems_keep_their_tests_only_with_min_tests_and_every_drop_is_counted():
    problems = [{"id": 0, "problem": "sum"}, {"id": 4, "problem": "double"}]
    rounds = [
        [
            {"text": answer([io("1 2", "3")]), "finish_reason": "stop"},
            {"text": answer([io("5", "10")]), "finish_reason": "stop"},
        ],
        [
            {"text": answer([io("2 2", "4")]), "finish_reason": "stop"},
            {"text": answer([io("5", "11")]), "finish_reason": "stop"},
        ],
        [{"text": "no tests", "finish_reason": "stop"}, {"text": answer([io("6", "12"), {}]), "finish_reason": "stop"}],
        [{"text": answer([io("1 2", "3")]), "finish_reason": "length"}, {"text": "x", "finish_reason": "length"}],
    ]
    rows, summary = cs.tests_rows(problems, rounds, SETTINGS)
    assert [r["id"] for r in rows] == [0]  # "double" keeps one test (6): fewer than min_tests = 2
    assert rows[0]["tests"] == [stdin("1 2\n", "3"), stdin("2 2\n", "4")]
    assert rows[0]["rounds"] == ["ok", "ok", "no_block", "truncated"]
    assert summary == {
        "problems": 2,
        "rounds": 4,
        "rounds_ok": 5,
        "rounds_truncated": 2,
        "rounds_no_block": 1,
        "rounds_bad_json": 0,
        "rounds_not_a_list": 0,
        "tests_parsed": 5,
        "tests_bad_test": 1,
        "tests_duplicate": 0,
        "tests_kept": 3,
        "inputs_conflicting": 1,
        "problems_too_few_tests": 1,
        "problems_with_tests": 1,
        "tests_used": 2,
    }
    relaxed, s = cs.tests_rows(problems, rounds, {**SETTINGS, "min_tests": 1})
    assert [r["id"] for r in relaxed] == [0, 4] and s["problems_too_few_tests"] == 0


# --- verification in the sandbox and pairs --------------------------------------------------------------------------

RIGHT = "a, b = map(int, input().split())\nprint(a + b)"
PROGRAMS = {
    "right": RIGHT,
    "wrong": "a, b = map(int, input().split())\nprint(a - b)",
    "spins": "while True:\n    pass",
    "crash": "raise RuntimeError('boom')",
}


def fenced(code: str, think: str = "reasoning") -> str:
    return f"{think}</think>Here it is.\n```python\n{code}\n```\n"


def test_programs_are_verified_against_every_test_in_the_real_sandbox(tmp_path):
    lt.write_jsonl(
        tmp_path / "tests.jsonl", [{"id": 7, "problem": "sum", "tests": [stdin("1 2\n", "3"), stdin("-4 4\n", "0")]}]
    )
    completions = [fenced(c) for c in PROGRAMS.values()] + ["I cannot write it.", fenced(RIGHT, "again")]
    lt.write_jsonl(
        tmp_path / "rollouts.jsonl", [{"id": 7, "problem": "sum", "message": "m", "completions": completions}]
    )
    summary = cs.verify(
        str(tmp_path / "tests.jsonl"), str(tmp_path / "rollouts.jsonl"), LIMITS, 3, str(tmp_path / "v.jsonl")
    )
    (row,) = lt.read_jsonl(tmp_path / "v.jsonl")
    assert row["status"] == ["pass", "wrong", "timeout", "error", "no_code", "pass"]
    assert row["passed"] == [True, False, False, False, False, True] and row["message"] == "m"
    assert summary == {
        "problems": 1,
        "completions": 6,
        "programs_run": 5,
        "pass_rate": pytest.approx(2 / 6),
        "problems_solved": 1,
        "status_error": 1,
        "status_no_code": 1,
        "status_pass": 2,
        "status_timeout": 1,
        "status_wrong": 1,
        "isolation": LIMITS["isolation"],
    }  # the repeated program ran once
    assert not (tmp_path / "v.jsonl.partial").exists()  # the per-problem progress is removed once the output is written
    # pass = every test: a program right on the first test only fails
    first_only = "a, b = map(int, input().split())\nprint(3)"
    lt.write_jsonl(
        tmp_path / "r2.jsonl", [{"id": 7, "problem": "sum", "message": "m", "completions": [fenced(first_only)]}]
    )
    cs.verify(str(tmp_path / "tests.jsonl"), str(tmp_path / "r2.jsonl"), LIMITS, 1, str(tmp_path / "v2.jsonl"))
    assert lt.read_jsonl(tmp_path / "v2.jsonl")[0]["status"] == ["wrong"]
    lt.write_jsonl(tmp_path / "r3.jsonl", [{"id": 8, "problem": "x", "message": "m", "completions": ["a"]}])
    with pytest.raises(ValueError, match=r"problems \[8\] have no tests"):
        cs.verify(str(tmp_path / "tests.jsonl"), str(tmp_path / "r3.jsonl"), LIMITS, 1, str(tmp_path / "v3.jsonl"))
    with pytest.raises(RuntimeError, match="cannot run a correct program"):  # the preflight (negative control)
        cs.verify(
            str(tmp_path / "tests.jsonl"),
            str(tmp_path / "rollouts.jsonl"),
            {**LIMITS, "memory_mb": 1},
            1,
            str(tmp_path / "v4.jsonl"),
        )


def test_verification_appends_per_problem_and_a_rerun_after_a_crash_grades_only_the_rest(tmp_path, monkeypatch):
    from paperflow.promptscale import code_eval

    lt.write_jsonl(
        tmp_path / "tests.jsonl", [{"id": i, "problem": "sum", "tests": [stdin("1 2\n", "3")]} for i in (1, 2)]
    )
    rollouts = [
        {"id": i, "problem": "sum", "message": "m", "completions": [fenced(RIGHT), fenced(f"print({i})")]}
        for i in (1, 2)
    ]
    lt.write_jsonl(tmp_path / "rollouts.jsonl", rollouts)
    args = (str(tmp_path / "tests.jsonl"), str(tmp_path / "rollouts.jsonl"))
    whole = cs.verify(*args, LIMITS, 1, str(tmp_path / "whole.jsonl"))
    real, graded = code_eval.grade, []

    def crashing(completion, row, limits):
        if graded and "print(2)" in completion:
            raise KeyboardInterrupt  # the job killed while problem 2 is graded
        graded.append(completion)
        return real(completion, row, limits)

    monkeypatch.setattr(code_eval, "grade", crashing)
    with pytest.raises(KeyboardInterrupt):
        cs.verify(*args, LIMITS, 1, str(tmp_path / "v.jsonl"))
    kept = (tmp_path / "v.jsonl.partial").read_text().splitlines()
    assert len(kept) == 2 and json.loads(kept[1])["id"] == 1  # the key, then problem 1
    (tmp_path / "v.jsonl.partial").write_text("\n".join(kept) + '\n{"id": 2, "passed": [tr')  # a torn last line
    graded.clear()
    monkeypatch.setattr(code_eval, "grade", lambda c, r, lim: graded.append(c) or real(c, r, lim))
    assert cs.verify(*args, LIMITS, 1, str(tmp_path / "v.jsonl")) == whole
    graded = [c for c in graded if "</think>" in c]  # the preflight's program aside
    assert len(graded) == 2 and all(c in rollouts[1]["completions"] for c in graded)  # problem 2 only
    assert (tmp_path / "v.jsonl").read_text() == (tmp_path / "whole.jsonl").read_text()
    # changed inputs do not resume: the partial file of other rollouts is discarded
    (tmp_path / "v.jsonl.partial").write_text("\n".join(kept) + "\n")
    lt.write_jsonl(tmp_path / "rollouts.jsonl", rollouts[::-1])
    graded.clear()
    cs.verify(*args, LIMITS, 1, str(tmp_path / "v.jsonl"))
    assert len([c for c in graded if "</think>" in c]) == 4


def test_verification_with_the_jobs_journal_resumes_there_and_writes_the_bytes_of_an_uninterrupted_run(
    tmp_path, monkeypatch
):
    """At paper scale the rule passes a journal in its checkpoint folder (code_eval.JournalProgress): the graded
    problems go there, not to `<out>.partial`, and a rerun after a kill grades only the rest, writing the bytes the
    uninterrupted run (Progress) writes."""
    from paperflow.promptscale import code_eval

    lt.write_jsonl(
        tmp_path / "tests.jsonl", [{"id": i, "problem": "sum", "tests": [stdin("1 2\n", "3")]} for i in (1, 2)]
    )
    rollouts = [
        {"id": i, "problem": "sum", "message": "m", "completions": [fenced(RIGHT), fenced(f"print({i})")]}
        for i in (1, 2)
    ]
    lt.write_jsonl(tmp_path / "rollouts.jsonl", rollouts)
    args = (str(tmp_path / "tests.jsonl"), str(tmp_path / "rollouts.jsonl"))
    whole = cs.verify(*args, LIMITS, 1, str(tmp_path / "whole.jsonl"))
    real, graded = code_eval.grade, []

    def crashing(completion, row, limits):
        if graded and "print(2)" in completion:
            raise KeyboardInterrupt  # the job killed while problem 2 is graded
        graded.append(completion)
        return real(completion, row, limits)

    journal = tmp_path / "checkpoints" / "rows.jsonl"
    monkeypatch.setattr(code_eval, "grade", crashing)
    with pytest.raises(KeyboardInterrupt):
        cs.verify(*args, LIMITS, 1, str(tmp_path / "v.jsonl"), journal)
    assert [json.loads(line)["id"] for line in journal.read_text().splitlines()] == ["graded:1"]
    assert not (tmp_path / "v.jsonl.partial").exists()
    graded.clear()
    monkeypatch.setattr(code_eval, "grade", lambda c, r, lim: graded.append(c) or real(c, r, lim))
    assert cs.verify(*args, LIMITS, 1, str(tmp_path / "v.jsonl"), journal) == whole
    graded = [c for c in graded if "</think>" in c]  # the preflight's program aside
    assert len(graded) == 2 and all(c in rollouts[1]["completions"] for c in graded)  # problem 2 only
    assert (tmp_path / "v.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


def verified(i, passed, texts=None):
    texts = texts or [fenced(f"print({i}{j})", f"r{j}") for j in range(len(passed))]
    return {"id": i, "problem": f"p{i}", "message": f"m{i}", "completions": texts, "passed": passed}


def test_code_pairs_are_built_as_the_math_pairs_from_hand_made_verified_rollouts():
    assert cs.well_formed(fenced("print(1)"), True) and cs.well_formed("```python\nprint(1)\n```", False)
    assert not cs.well_formed("```python\nprint(1)\n```", True)  # no closed reasoning
    assert not cs.well_formed("r</think> no code", True) and not cs.well_formed("</think>```python\nx\n```", True)
    assert not cs.well_formed("a</think> b</think>```python\nx\n```", True)
    mixed = [
        fenced("print(1)", "a"),
        fenced("print(1)", "a"),
        fenced("print(2)", "b"),
        "r</think> none",
        fenced("print(3)", "c"),
        fenced("print(4)", "d"),
        fenced("print(5)", "e"),
        fenced("print(6)", "f"),
    ]
    rows = [
        verified(0, [True] * 8),  # too easy
        verified(1, [False] * 8),  # unsolved
        verified(2, [True, True, True, False, True, False, False, False], mixed),  # 4 / 8 pass: paired
        verified(3, [True, False, False, False], ["```python\nx\n```"] * 4),  # no reasoning closed: nothing to pair
    ]
    pairs, summary = cs.build_pairs(rows, SELFPLAY)
    assert summary == {
        "problems": 4,
        "problems_paired": 1,
        "problems_unsolved": 1,
        "problems_too_easy": 1,
        "problems_no_valid": 1,
        "pairs": 3,
        "mean_pass_rate": pytest.approx((1 + 0 + 0.5 + 0.25) / 4),
    }
    # chosen: the distinct well-formed passing (a, b, c: the repeat of a once); rejected: d, e, f (the one without
    # code is not well-formed); the i-th with the i-th
    got = sorted((p["chosen"], p["rejected"]) for p in pairs)
    assert got == [(mixed[0], mixed[5]), (mixed[2], mixed[6]), (mixed[4], mixed[7])]
    assert {(p["id"], p["domain"], p["message"]) for p in pairs} == {(2, "code", "m2")}
    assert len(cs.build_pairs(rows, {**SELFPLAY, "max_pairs_per_problem": 2})[0]) == 2
    strict, s = cs.build_pairs(rows, {**SELFPLAY, "max_pass_rate": 0.4})
    assert strict == [] and s["problems_too_easy"] == 2


# --- end to end ----------------------------------------------------------------------------------------------------

PROBLEMS = {  # the synthesised code problems, their tester's tests by round, the policy's programs
    "Sum: read a and b, print a + b.": "sum",
    "Double: read n, print 2 n.": "double",
    "Max: read three integers, print the largest.": "max",
}


def scripted_tests(kind: str, r: int) -> tuple[str, str]:
    """(text, finish_reason) of the tester for a problem in round r."""
    if kind == "sum":  # three distinct tests; round 3 repeats round 0's, agreeing
        a = r % 3
        return answer([io(f"{a} {a + 1}", str(2 * a + 1))]), "stop"
    if kind == "double":  # round 1 disagrees with round 0 on input 5; nothing else survives
        return [
            (answer([io("5", "10")]), "stop"),
            (answer([io("5", "11")]), "stop"),
            ("no block", "stop"),
            (answer([io("6", "12")]), "length"),
        ][r]
    return (answer([io(f"{r} 9 {r}", "9")]) if r != 2 else "r</think>```json\n[{oops}]\n```"), "stop"


def policy_programs(kind: str, seed: int, n: int) -> list[str]:
    if kind == "sum":
        codes = [RIGHT, PROGRAMS["wrong"], None, RIGHT + "  # checked"]
    else:
        codes = ["print(max(map(int, input().split())))"] * n
    return [fenced(c, f"think {seed} {j}") if c else f"think {seed} {j}</think> no idea" for j, c in enumerate(codes)]


def test_code_self_play_runs_end_to_end_and_dpo_trains_on_math_and_code_pairs(tiny_model_folder, tmp_path):
    from paperflow.promptscale import dpo, paper_report

    synth = [{"problem": "Find 2 squared.", "valid": True}]  # no domain: math
    synth += [{"problem": p, "valid": True, "domain": "code"} for p in PROBLEMS]
    synth.insert(2, {"problem": "Sum: read a and b, print a + b.", "valid": True, "domain": "code"})  # a repeat
    synth += [
        {"problem": None, "valid": False, "domain": "code"},
        {"problem": "Find 3 cubed.", "valid": True, "domain": "math"},
    ]
    lt.write_jsonl(tmp_path / "synth.jsonl", synth)
    assert [p["id"] for p in sp.selfplay_problems(synth, None)] == [0, 6]  # the math self-play takes math only
    assert [p["id"] for p in cs.code_problems(synth, None)] == [1, 3, 4]

    def tester(path, body):
        assert path.endswith("/chat/completions") and body["n"] == 1, path
        message = body["messages"][0]["content"]
        i, kind = next((i, k) for i, (p, k) in enumerate(PROBLEMS.items()) if f"Problem:\n{p}\n" in message)
        text, finish = scripted_tests(kind, (body["seed"] - i) // 3)
        return [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}]

    with FakeOpenAI(tester, name="tester") as server:
        summary = cs.generate_tests(
            "/t",
            str(tmp_path / "synth.jsonl"),
            SETTINGS,
            vllm_cfg(server.url.removesuffix("/v1")),
            "bfloat16",
            str(tmp_path / "tests.jsonl"),
            str(tmp_path / "vllm.log"),
        )
        bodies = list(server.bodies)
    assert sorted(b["seed"] for b in bodies) == list(range(12))  # round r, problem i: 0 + 3 r + i
    assert {(b["temperature"], b["max_tokens"], b["top_k"], b["top_p"]) for b in bodies} == {(0.6, 128, -1, 1.0)}
    assert all("write one new test case" in b["messages"][0]["content"] for b in bodies)
    assert summary == {
        "problems": 3,
        "rounds": 4,
        "rounds_ok": 9,
        "rounds_truncated": 1,
        "rounds_no_block": 1,
        "rounds_bad_json": 1,
        "rounds_not_a_list": 0,
        "tests_parsed": 9,
        "tests_bad_test": 0,
        "tests_duplicate": 1,
        "tests_kept": 6,
        "inputs_conflicting": 1,
        "problems_too_few_tests": 1,
        "problems_with_tests": 2,
        "tests_used": 6,
    }
    tests = lt.read_jsonl(tmp_path / "tests.jsonl")
    assert [(t["id"], len(t["tests"])) for t in tests] == [(1, 3), (4, 3)]
    assert tests[0]["tests"] == [stdin("0 1\n", "1"), stdin("1 2\n", "3"), stdin("2 3\n", "5")]

    def policy(path, body):
        message = body["messages"][0]["content"]
        assert "Read the input from standard input" in message and lt.MATH_INSTRUCTION not in message
        kind = next(k for p, k in PROBLEMS.items() if f"Question: {p}\n" in message)
        return chat_choices(policy_programs(kind, body["seed"], body["n"]))

    with FakeOpenAI(policy, name="base") as server:
        rolled = cs.code_rollouts(
            "/p",
            str(tmp_path / "tests.jsonl"),
            SELFPLAY,
            vllm_cfg(server.url.removesuffix("/v1")),
            "bfloat16",
            str(tmp_path / "rollouts.jsonl"),
            str(tmp_path / "vllm.log"),
        )
        bodies = list(server.bodies)
    assert rolled == {"problems": 2, "completions": 16, "truncated": 0.0}
    assert sorted(b["seed"] for b in bodies) == [10, 11, 12, 13]  # pass s, problem i: 10 + 2 s + i
    assert {(b["temperature"], b["n"]) for b in bodies} == {(1.2, 4)}

    checked = cs.verify(
        str(tmp_path / "tests.jsonl"), str(tmp_path / "rollouts.jsonl"), LIMITS, 2, str(tmp_path / "verified.jsonl")
    )
    assert checked["pass_rate"] == pytest.approx(12 / 16) and checked["problems_solved"] == 2
    assert checked["programs_run"] == 5  # sum: right, wrong, none, right + comment; max: one program
    counts = cs.pairs_job(str(tmp_path / "verified.jsonl"), SELFPLAY, str(tmp_path / "code_pairs.jsonl"))
    assert counts["problems_paired"] == 1 and counts["problems_too_easy"] == 1 and counts["pairs"] == 2
    code_pairs = lt.read_jsonl(tmp_path / "code_pairs.jsonl")
    assert all("print(a - b)" in p["rejected"] and "print(a + b)" in p["chosen"] for p in code_pairs)
    with pytest.raises(ValueError, match="no code DPO pair"):
        cs.pairs_job(str(tmp_path / "verified.jsonl"), {**SELFPLAY, "max_pass_rate": 0.1}, str(tmp_path / "x.jsonl"))

    math_pairs = [
        {
            "id": 0,
            "problem": "Find 2 squared.",
            "reference": "4",
            "chosen": "a</think> \\boxed{4}",
            "rejected": "a</think> \\boxed{5}",
        }
    ]
    lt.write_jsonl(tmp_path / "math_pairs.jsonl", math_pairs)
    merged = cs.merge_pairs(
        [str(tmp_path / "math_pairs.jsonl"), str(tmp_path / "code_pairs.jsonl")], str(tmp_path / "all.jsonl")
    )
    assert merged == {"pairs_code": 2, "pairs_math": 1}
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_folder)
    code_prompt = dpo.chat_prompt(tok, code_pairs[0]["problem"], code_pairs[0]["message"])
    assert code_pairs[0]["message"] in code_prompt and lt.MATH_INSTRUCTION not in code_prompt  # the rollout's message
    assert lt.MATH_INSTRUCTION in dpo.chat_prompt(tok, "Find 2 squared.")  # a math pair: the benchmark message
    (tmp_path / "policy.json").write_text(json.dumps({"folder": str(tiny_model_folder)}))
    settings = {
        "beta": 0.1,
        "loss_type": "sigmoid",
        "learning_rate": 1e-2,
        "per_device_train_batch_size": 3,
        "max_length": 512,
        "seed": 0,
        "max_steps": 1,
        "bf16": False,
        "gradient_checkpointing": False,
    }
    out = dpo.dpo_job(
        str(tmp_path / "policy.json"),
        str(tmp_path / "all.jsonl"),
        settings,
        "cpu",
        1,
        str(tmp_path / "models" / "selfplay.json"),
        str(tmp_path / "history.json"),
    )
    history = json.loads((tmp_path / "history.json").read_text())
    assert out["steps"] == 1 and history[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # one batch: all three

    stages = {"code_tests": summary, "code_rollouts": rolled, "code_verify": checked, "code_pairs": counts}
    ((title, table),) = paper_report.code_selfplay_sections(stages)
    assert "| 3 | 2 | 6 | 1 | 16 | 0.75 | 2 | 1 | 2 |" in table.replace(".0 |", " |")
    assert paper_report.code_selfplay_sections({}) == []
    assert "on code by unit tests" in paper_report.selfplay_limitation(stages)


# --- the DAG and the config ----------------------------------------------------------------------------------------


def rule_inputs(stdout: str, rule: str) -> list[str]:
    return re.search(rf"rule {rule}:\n\s+input: (.*)", stdout).group(1).split(", ")


def test_the_paper_dag_runs_code_self_play_with_gpus_only_on_the_vllm_rules(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    config = load_paper_config("promptscale", "paper")
    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    jobs = parse_dry_run(proc.stdout)
    gpus = {j.rule: j.gpus for j in jobs if j.rule.startswith("promptscale_code_")}
    assert gpus == {
        "promptscale_code_tests": config["code_selfplay"]["tester_gpus"],  # 4: the README's --n_gpus 4
        "promptscale_code_rollouts": config["resources"]["sample_gpus"],
        "promptscale_code_verify": 0,
        "promptscale_code_pairs": 0,
    }
    assert gpus["promptscale_code_tests"] == 4
    assert {j.wildcards["role"] for j in jobs if j.rule == "promptscale_download_model"} == {
        "prompt",
        "policy",
        "tester",
    }
    assert "synth/em.jsonl" in " ".join(rule_inputs(proc.stdout, "promptscale_code_tests"))
    dpo_inputs = rule_inputs(proc.stdout, "promptscale_dpo")
    assert sorted(i.split("promptscale/", 1)[1] for i in dpo_inputs if i.endswith("pairs.jsonl")) == [
        "code_selfplay/pairs.jsonl",
        "selfplay/pairs.jsonl",
    ]
    report = [i.split("promptscale/", 1)[1] for i in rule_inputs(proc.stdout, "promptscale_report")]
    assert {f"code_selfplay/{s}.json" for s in ("tests", "rollouts", "verify", "pairs")} <= set(report)


def test_with_math_only_no_code_self_play_job_is_planned_and_dpo_takes_the_math_pairs(repo_copy):
    from conftest import run_snakemake

    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    assert "    domains: [math, code]" in text
    path.write_text(text.replace("    domains: [math, code]", "    domains: [math]"))
    proc = run_snakemake(repo_copy, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    counts = dict(re.findall(r"^(promptscale_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert not [r for r in counts if r.startswith("promptscale_code_")] and counts["promptscale_dpo"] == "1"
    assert counts["promptscale_download_model"] == "2"  # no tester
    assert [i for i in rule_inputs(proc.stdout, "promptscale_dpo") if "pairs" in i][0].endswith("selfplay/pairs.jsonl")
    assert "code_selfplay" not in proc.stdout


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    tests_per_round: 1 ", "    test_per_round: 1 "), "test_per_round"),
        (("    tester_gpus: 4 ", "    tester_gpus: 0 "), "tester_gpus"),
        (
            (
                "      hub: Qwen/Qwen3-32B\n      repo_type: model\n      revision:",
                "      hub: Qwen/Qwen3-32B\n      repo_type: model\n      revison:",
            ),
            "revison",
        ),
        (("    min_tests: 2 ", "    min_tests: 5 "), "min_tests exceeds"),  # 4 rounds x 1 test
    ],
)
def test_config_errors_in_the_code_self_play_keys_name_the_key(repo_copy, edit, message):
    from conftest import run_snakemake

    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1], 1))
    if "exceeds" not in message:  # the schema
        with pytest.raises(ConfigError, match=message):
            load_paper_config("promptscale", "paper", repo_copy)
    else:  # a cross-key rule: refused when the workflow is parsed
        proc = run_snakemake(repo_copy, "-n", "--config", "scale=paper", "papers=[promptscale]", check=False)
        assert proc.returncode != 0 and "code_selfplay.min_tests exceeds" in proc.stdout + proc.stderr


def test_code_self_play_needs_a_tester_and_its_block_only_when_code_is_a_domain(cfg):
    cs.check_paper(cfg, "cfg")  # the shipped config passes
    no_tester = {**cfg, "models": {k: v for k, v in cfg["models"].items() if k != "tester"}}
    with pytest.raises(ConfigError, match="models.tester"):
        cs.check_paper(no_tester, "cfg")
    without = {k: v for k, v in cfg.items() if k != "code_selfplay"}
    with pytest.raises(ConfigError, match="no code_selfplay block"):
        cs.check_paper(without, "cfg")
    with pytest.raises(ConfigError, match="'max_token'"):
        cs.check_settings({**SETTINGS, "max_token": 5})
    math_only = {**without, "seeds_data": {**cfg["seeds_data"], "domains": ["math"]}}
    cs.check_paper({**math_only, "models": no_tester["models"]}, "cfg")  # math only: nothing is needed
