"""enterpriseops_gym's language-model agent (issue 48, cpu scale's `llm_cpu`): the plan variants' prompts, the task
subset, the whole path (the kit's LocalServer with tools -> the paper-scale ReactAgent -> the sandbox's tools ->
the verifiers) with the model's generations canned, its records in the episode schema and scored by the claims,
the report's section, and config errors by key."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
from fake_openai import FakeOpenAI, chat_choices

from paperflow.core.claims import CONTROL_HOLDS, HELD, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.lm.local_server import LocalServer
from paperflow.enterpriseops_gym import agents as A
from paperflow.enterpriseops_gym import claims, harness, llm, settings, stages, tasks
from paperflow.enterpriseops_gym.sandbox import Template, WorldSize, world_sql

CPU = load_paper_config("enterpriseops_gym", "cpu")
LLM = CPU["llm_cpu"]


@pytest.fixture(scope="module")
def world():
    sql = world_sql(0, WorldSize())
    ts = tasks.build_tasks(sql, 19, 9, 0, ["oracle"])
    return Template(sql), [tasks.load_task(json.loads(json.dumps(r))) for r in ts.modes["oracle"]]


class CharTokenizer:
    """Characters as token ids; a chat template of `<|role|>content` turns that ignores `tools` (as SmolLM2's)."""

    pad_token_id, eos_token_id = 0, 1

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=True):
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}" for m in messages)
        text += "<|assistant|>" if add_generation_prompt else ""
        return [ord(c) for c in text] if tokenize else text

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class Model:
    class config:  # noqa: N801 (the transformers attribute)
        max_position_embeddings = 1 << 20


def scripted(monkeypatch, tasks_by_prompt, idle=False):
    """The served model, canned: it finds its task by the user prompt in the rendered prompt, calls the task's
    recorded trajectory one <tool_call> block per turn (the tool results read back as <tool_response> blocks), then
    answers the recorded answer; `idle` answers a refusal at once."""

    def run(self, jobs):
        for job in jobs:
            prompt = self.tokenizer.decode(job.ids)
            assert "<tools>" in prompt, "the tools did not reach the prompt"
            task = next(t for p, t in tasks_by_prompt.items() if p in prompt)
            done = prompt.count("<tool_response>")
            steps = task["eog"]["recorded_trajectory"]
            if idle:
                text = "I cannot do this."
            elif done < len(steps):
                call = {"name": steps[done]["tool"], "arguments": steps[done]["args"]}
                text = f"Step {done + 1}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
            else:
                text = task["eog"]["recorded_answer"]
            job.result = [{"text": text, "finish_reason": "stop", "tokens": len(text)} for _ in range(job.n)]

    monkeypatch.setattr(LocalServer, "_run", run)


def cfg(**over):
    out = copy.deepcopy(LLM)
    out.update(over)
    return out


def test_the_plan_variants_prompts(world):
    _, ts = world
    plain = llm.planned_tasks(ts, "plain", 0)
    oracle = llm.planned_tasks(ts, "oracle_plan", 0)
    shuffled = llm.planned_tasks(ts, "shuffled_plan", 0)
    assert [t["user_prompt"] for t in plain] == [t["user_prompt"] for t in ts]
    task = next(t for t in ts if t["eog"]["template"] == "incident_assignee")
    text = llm.plan_text(task["eog"]["golden_plan"])
    assert text.splitlines() == [
        "Plan:",
        f'1. Call itsm_search_incidents with {{"number": "{task["eog"]["golden_plan"][0]["args"]["number"]}"}}.',
        '2. Call get_user with {"user_id": <step 1 result: items.0.assigned_to>}.',
        "3. Answer the user.",
    ]
    for t, o in zip(ts, oracle):
        assert o["user_prompt"] == t["user_prompt"] + "\n\n" + llm.plan_text(t["eog"]["golden_plan"])
        steps = o["user_prompt"].split("Plan:\n")[1].splitlines()  # calls, then "answer": never whether it is feasible
        assert all(" Call " in x for x in steps[:-1]) and steps[-1] == f"{len(steps)}. Answer the user."
        assert o["verifiers"] == t["verifiers"] and o["task_id"] == t["task_id"]
    # the control: every task gets a plan of another template; the plans are the same multiset, permuted
    texts = {llm.plan_text(t["eog"]["golden_plan"]): t["eog"]["template"] for t in ts}
    got = [s["user_prompt"].split("\n\n")[-1] for s in shuffled]
    assert all(texts[g] != t["eog"]["template"] for g, t in zip(got, ts))
    assert sorted(got) == sorted(llm.plan_text(t["eog"]["golden_plan"]) for t in ts)
    assert got == [s["user_prompt"].split("\n\n")[-1] for s in llm.planned_tasks(ts, "shuffled_plan", 0)]
    assert got != [s["user_prompt"].split("\n\n")[-1] for s in llm.planned_tasks(ts, "shuffled_plan", 1)]
    same = [dict(t, eog={**t["eog"], "template": "one"}) for t in ts]
    with pytest.raises(ValueError, match="shuffled_plan"):
        llm.shuffled_plans(same, 0)
    with pytest.raises(ConfigError, match="llm_cpu.plans: 'hint' is not one of"):
        llm.planned_tasks(ts, "hint", 0)


def test_the_task_subset_keeps_the_files_order(world):
    _, ts = world
    sub = llm.task_subset(ts, 5, 2)
    assert [t["eog"]["feasible"] for t in sub].count(True) == 5 and len(sub) == 7
    assert [t["task_id"] for t in sub] == [t["task_id"] for t in ts if t in sub]
    assert sub[:5] == [t for t in ts if t["eog"]["feasible"]][:5]
    assert llm.task_subset(ts, None, None) == ts
    with pytest.raises(ConfigError, match=r"llm_cpu.tasks.infeasible = 10: the task set has only 9"):
        llm.task_subset(ts, 1, 10)


def test_the_served_model_solves_tasks_through_the_harness_and_the_records_are_episodes(world, monkeypatch):
    """The whole cpu path with the generations canned: the tools reach the prompt, each <tool_call> block is run on
    the sandbox by the ReactAgent and its result read back, and the verifiers score the end state. A model that
    calls the recorded trajectory solves a lookup; one that declines at once solves no feasible task and refuses
    the infeasible ones."""
    template, ts = world
    lookup = next(t for t in ts if t["eog"]["template"] == "incident_assignee")
    infeasible = [t for t in ts if not t["eog"]["feasible"]][:2]
    chosen = [lookup, *infeasible]
    by_prompt = {t["user_prompt"]: t for t in chosen}
    open_session = lambda t: harness.LocalSession(template, t)  # noqa: E731
    scripted(monkeypatch, by_prompt)
    records, notes = llm.run_plan(Model(), CharTokenizer(), [lookup], open_session, "oracle_plan", cfg())
    (rec,) = records
    assert rec["agent"] == "llm_oracle_plan" and rec["overall_success"], rec["verification_summary"]
    assert rec["tool_calls"] == len(lookup["eog"]["recorded_trajectory"]) and rec["errored"] is None
    assert set(stages.EPISODE_COLUMNS) <= set(rec)
    assert notes["usage"]["prompt_tokens"] > 0 and notes["plan"] == "oracle_plan"
    roles = [m["role"] for m in rec["conversation_flow"]]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    scripted(monkeypatch, by_prompt, idle=True)
    idle, _ = llm.run_plan(Model(), CharTokenizer(), chosen, open_session, "plain", cfg(concurrency=3))
    assert [r["task_id"] for r in idle] == [t["task_id"] for t in chosen]  # the tasks' order, whatever the threads
    assert not idle[0]["overall_success"] and all(r["refused_correctly"] for r in idle[1:])
    assert all(r["agent"] == "llm_plain" and r["tool_calls"] == 0 for r in idle)


def episode(task_id, agent, feasible, success=False, refused=False, errored=None, mode="oracle"):
    return {
        "task_id": task_id,
        "domain": "itsm",
        "mode": mode,
        "agent": agent,
        "run": 0,
        "feasible": feasible,
        "infeasible_kind": None if feasible else "policy",
        "category": "lookup",
        "n_golden_steps": 2,
        "errored": errored,
        "overall_success": success,
        "verifiers_total": 2,
        "verifiers_passed": 2 * success,
        "verifier_pass_rate": float(success),
        "tool_calls": 2 * success,
        "state_changing_calls": 0,
        "failed_calls": 0,
        "declined": refused,
        "refused_correctly": refused,
        "side_effect": False,
        "final_db_hash": "h",
        "response": "",
        "wall_ms": 1.0,
    }


def llm_claims_table(gain: list[bool], control: list[bool], refusals: list[bool], errored_oracle: bool = False):
    rows = []
    for i, (g, c) in enumerate(zip(gain, control)):
        t = f"f{i}"
        rows += [episode(t, "llm_plain", True), episode(t, "golden", True, success=True)]
        err = "HTTP 500; after 3 attempt(s)" if errored_oracle else None
        rows += [
            episode(t, "llm_oracle_plan", True, success=g, errored=err),
            episode(t, "llm_shuffled_plan", True, success=c),
        ]
    for i, r in enumerate(refusals):
        t = f"i{i}"
        rows += [episode(t, "llm_plain", False, refused=r), episode(t, "golden", False, refused=True)]
        rows += [episode(t, "noop", False, refused=True)]
    frame = pd.DataFrame(rows)
    return claims.metrics_table(frame, pd.DataFrame(), 0, [0], ["oracle"], "cpu")


def verdicts(table):
    specs = parse_claims([c for c in CPU["claims"] if c["id"].startswith("llm_")], "test")
    return {v.id: v for v in judge_all(specs, table, "cpu")}


def test_the_llm_claims_are_judged_on_the_episodes_and_their_controls_can_void_them():
    n = 30
    out = verdicts(llm_claims_table([True] * 20 + [False] * 10, [False] * n, [False] * 8 + [True] * 4))
    assert out["llm_oracle_plan_raises_success"].verdict == HELD
    assert out["llm_oracle_plan_raises_success"].control["verdict"] != HELD
    assert out["llm_refusal_below_golden"].verdict == HELD
    assert out["llm_refusal_below_golden"].control["verdict"] != HELD  # noop refuses as golden does
    # the plan of another task helps as much: the gain is the prompt's, not the plan's
    voided = verdicts(llm_claims_table([True] * 20 + [False] * 10, [True] * 20 + [False] * 10, [False] * 12))
    assert voided["llm_oracle_plan_raises_success"].verdict == CONTROL_HOLDS
    # no success in either variant (SmolLM2 making no call): refuted, not inconclusive; errored episodes are failures
    none = verdicts(llm_claims_table([False] * n, [False] * n, [True] * 12))
    assert none["llm_oracle_plan_raises_success"].verdict == REFUTED
    assert none["llm_refusal_below_golden"].verdict == REFUTED
    errored = verdicts(llm_claims_table([True] * n, [False] * n, [False] * 12, errored_oracle=True))
    assert errored["llm_oracle_plan_raises_success"].verdict == REFUTED


def test_the_report_section_gives_rates_per_plan_and_domain(world):
    frame = pd.DataFrame(
        [
            episode("f0", "llm_plain", True),
            episode("f1", "llm_oracle_plan", True, success=True),
            episode("i0", "llm_plain", False, refused=True),
            episode("i0", "llm_oracle_plan", False, errored="HTTP 500; after 3 attempt(s)", refused=True),
            episode("f1", "llm_plain", True, success=True, mode="plus_10"),
        ]
    )
    notes = {"llm_plain": {"wall_s": 12.0, "usage": {"prompt_tokens": 10, "completion_tokens": 5}}}
    text = claims.llm_section(frame, notes, cfg(plans=["plain", "oracle_plan"]))
    lines = [l for l in text.splitlines() if l.startswith("| ")]
    plain_all = next(l for l in lines if l.startswith("| plain | oracle | all"))
    oracle_all = next(l for l in lines if l.startswith("| oracle_plan | oracle | all"))
    plus_10 = next(l for l in lines if l.startswith("| plain | plus_10 | all"))
    assert "0.000 (0/1)" in plain_all and "1.000 (1/1)" in plain_all  # success 0, refusal 1
    assert "1.000 (1/1) | 1.000" in oracle_all and "0.000 (0/1)" in oracle_all  # the errored refusal fails
    assert plus_10.split(" | ")[3] == "1.000 (1/1)"  # the other mode's episode: its own row, not pooled
    assert not any(l.startswith("| oracle_plan | plus_10") for l in lines)
    assert "plain 12 s (10 prompt + 5 completion tokens)" in text


def test_config_errors_name_the_key():
    bad = copy.deepcopy(CPU)
    bad["llm_cpu"]["mode"] = "plus_15"
    with pytest.raises(ConfigError, match=r"llm_cpu.mode = 'plus_15'"):
        settings.check(bad, "x")
    bad = copy.deepcopy(CPU)
    bad["llm_cpu"]["plain_modes"] = ["oracle"]
    with pytest.raises(ConfigError, match=r"llm_cpu.plain_modes: unknown mode 'oracle'"):
        settings.check(bad, "x")
    assert settings.llm_modes(CPU["llm_cpu"], "plain") == ["oracle", "plus_5", "plus_10"]
    assert settings.llm_modes(CPU["llm_cpu"], "oracle_plan") == ["oracle"]
    bad = copy.deepcopy(CPU)
    bad["llm_cpu"]["plans"] = ["oracle_plan"]
    with pytest.raises(ConfigError, match=r"llm_cpu.plans.*plain"):
        settings.check(bad, "x")
    bad = copy.deepcopy(CPU)
    bad["source"] = {"kind": "official"}
    with pytest.raises(ConfigError, match="llm_cpu is for source.kind synthetic"):
        settings.check_llm(bad, "x")
    assert "llm_oracle_plan" in settings.claim_methods(CPU)
    smoke = load_paper_config("enterpriseops_gym", "smoke")
    assert smoke["llm_cpu"] is None
    assert {"llm_oracle_plan_raises_success", "llm_refusal_below_golden"} <= set(smoke["claims_not_measured"])


def test_golden_declines_every_infeasible_task(world):
    """What the refusal claim compares with: golden replay declines every infeasible task without a write."""
    template, ts = world
    recs = [harness.run_episode(t, A.Golden(), lambda t: harness.LocalSession(template, t)) for t in ts]
    assert all(r["refused_correctly"] for r in recs if not r["feasible"])


def test_a_request_past_its_timeout_is_retried_then_errors_the_episode(world):
    """The harness sends through the kit's Client: a server slower than `timeout_s` is retried and then the episode
    errors (it used to raise out of the job: urllib's read timeout escaped the old sender)."""
    import time

    def slow(path, body):
        time.sleep(1.0)
        return chat_choices(["too late"])

    template, ts = world
    with FakeOpenAI(slow) as server:
        agent = harness.ReactAgent(server.url, server.name, retries=1, timeout_s=0.2)
        rec = harness.run_episode(ts[0], agent, lambda t: harness.LocalSession(template, t))
        hits = list(server.paths)
    assert hits == ["/v1/chat/completions"] * 2
    assert "TimeoutError" in rec["errored"] and rec["errored"].endswith("after 2 attempt(s)")
    assert not rec["overall_success"]


def test_the_plain_job_runs_each_of_its_modes_and_sums_their_usage(tmp_path, monkeypatch):
    """run_llm on two modes' task files: every configured task of each mode once, in the modes' order, each record
    carrying its own mode; usage and wall summed over modes, each mode's notes kept."""
    sql = world_sql(0, WorldSize())
    ts = tasks.build_tasks(sql, 19, 9, 0, ["oracle", "plus_5"])
    paths = {}
    for mode in ("oracle", "plus_5"):
        paths[mode] = tmp_path / f"{mode}.jsonl"
        stages.write_jsonl(paths[mode], ts.modes[mode])
    (tmp_path / "seed.sql").write_text(sql)
    by_prompt = {t["user_prompt"]: t for m in ts.modes.values() for t in map(tasks.load_task, m)}
    scripted(monkeypatch, by_prompt, idle=True)
    monkeypatch.setattr(llm, "load_model", lambda model_json, pretrained: (Model(), CharTokenizer()))
    conf = cfg(tasks={"feasible": 2, "infeasible": 1})
    records, notes = llm.run_llm("plain", "unused.json", str(tmp_path / "seed.sql"), paths, conf)
    assert [r["mode"] for r in records] == ["oracle"] * 3 + ["plus_5"] * 3
    assert notes["modes"] == ["oracle", "plus_5"] and set(notes["per_mode"]) == {"oracle", "plus_5"}
    per = notes["per_mode"]
    assert (
        notes["usage"]["prompt_tokens"]
        == per["oracle"]["usage"]["prompt_tokens"] + per["plus_5"]["usage"]["prompt_tokens"]
    )
    assert per["plus_5"]["usage"]["prompt_tokens"] > per["oracle"]["usage"]["prompt_tokens"]  # five more tools shown
