"""enterpriseops_gym's acceptance checks (spec sections 10 and 11): soundness of every generated task, the official
verifier semantics, reset isolation, protocol conformance of the MCP server (with the `mcp` package's own client),
the database API and the OpenAI-compatible endpoint, a task in the official column layout, pass^k against its
closed form, tool policy and atomicity, symbolic references, the claims and a negative control for each gated one,
and config errors by name."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re

import pandas as pd
import pytest

from paperflow.core.claims import HELD, NO_DATA, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.enterpriseops_gym import agents as A
from paperflow.enterpriseops_gym import (
    alternatives,
    claims,
    endpoint,
    harness,
    metrics,
    mutation,
    stages,
    tasks,
    verifiers,
)
from paperflow.enterpriseops_gym import tools as T
from paperflow.enterpriseops_gym.sandbox import TABLES, Template, WorldSize, world_sql

MODES = ["oracle", "plus_5", "plus_10"]


@pytest.fixture(scope="module")
def world():
    sql = world_sql(0, WorldSize())
    ts = tasks.build_tasks(sql, 19, 9, 0, MODES)
    return sql, Template(sql), {m: [tasks.load_task(json.loads(json.dumps(r))) for r in ts.modes[m]] for m in MODES}


def local(template):
    return lambda t: harness.LocalSession(template, t)


def run_all(template, by_mode, agent, run=0):
    return [harness.run_episode(t, agent, local(template), run=run) for m in MODES for t in by_mode[m]]


@pytest.fixture(scope="module")
def episodes(world):
    _, template, by_mode = world
    rows = []
    for bot in (A.Noop(), A.Heuristic(), A.Golden(), A.GoldenGuided(), A.golden_literal()):
        rows += run_all(template, by_mode, bot)
    for i, seed in enumerate((0, 1)):
        rows += run_all(template, by_mode, A.RandomAgent(seed), run=i)
    rows += mock_run(template, [t for m in MODES for t in by_mode[m]])
    return frame(rows)


def frame(rows):
    return pd.DataFrame([{k: r[k] for k in stages.EPISODE_COLUMNS} for r in rows])


def mock_run(template, task_list, model=None):
    model = model or endpoint.ScriptedModel(task_list)
    with endpoint.Endpoint(model) as url:
        agent = harness.ReactAgent(url, "mock", name="mock_llm")
        return [harness.run_episode(t, agent, local(template)) for t in task_list]


# ---- pass^k and verifier semantics -------------------------------------------------------------------------------


def test_pass_hat_k_equals_the_share_of_all_successful_k_subsets():
    for n in range(1, 6):
        for c in range(n + 1):
            outcomes = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                assert metrics.pass_hat_k(c, n, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError, match="0 < k <= n"):
        metrics.pass_hat_k(1, 2, 3)


def test_pass_hat_k_table_averages_over_tasks():
    ep = pd.DataFrame(
        {
            "agent": "a",
            "mode": "oracle",
            "task_id": ["x"] * 3 + ["y"] * 3,
            "overall_success": [1, 1, 0, 1, 0, 0],
            "errored": None,
        }
    )
    t = metrics.pass_hat_k_table(ep).set_index("k")["pass_hat_k"]
    assert t[1] == pytest.approx((2 / 3 + 1 / 3) / 2) and t[2] == pytest.approx((1 / 3 + 0) / 2) and t[3] == 0


def test_extraction_follows_the_official_shapes():
    assert verifiers.extract([{"n": 3}]) == 3
    assert verifiers.extract([{"a": 1, "b": "x"}]) == {"a": 1, "b": "x"}
    assert verifiers.extract([{"a": 1}, {"a": 2}]) == [{"a": 1}, {"a": 2}]
    assert verifiers.extract([]) == []


@pytest.mark.parametrize(
    "actual,expected,kind,ok",
    [
        (1, 1, "equals", True),
        (1, "1", "equals", False),  # type-sensitive, as the official comparison
        ({"a": 1}, {"a": 1}, "equals", True),
        ([{"a": 1}, {"a": 2}], [{"a": 2}, {"a": 1}], "equals", False),  # order-sensitive
        (5, 3, "greater_than", True),
        (3, 3, "greater_than", False),
        (2, 3, "less_than", True),
        ("abc", 3, "less_than", False),
        ({"state": "resolved"}, "resolved", "contains", True),
        ("closed", "resolved", "contains", False),
    ],
)
def test_comparison_types(actual, expected, kind, ok):
    assert verifiers.compare(actual, expected, kind) is ok


def test_response_check_minimum_comparison_value_and_tool_execution():
    query = lambda sql: [{"name": "Ada Sato"}]
    check = {
        "verifier_type": "response_check",
        "name": "r",
        "sql_query": "q",
        "comparison_prompt": "",
        "judge_rule": "contains_sql_result",
    }
    run = lambda v, resp, calls=(): verifiers.run_verifier(
        v, query, resp, calls, harness.columns_of, verifiers.DeterministicJudge()
    )
    assert run(check, "It is ada sato.")["passed"]
    assert not run(check, "It is Ada.")["passed"]
    assert not run({**check, "minimum_comparison_value": 11}, "It is Ada Sato")["passed"]
    assert run({**check, "judge_rule": "declines"}, "I cannot do this")["passed"]
    tool = {"verifier_type": "tool_execution", "name": "t", "selected_tools": ["a", "b"], "minimum_tool_calls": 3}
    assert run(tool, "", ["a", "b", "a"])["passed"] and not run(tool, "", ["a", "b"])["passed"]
    assert verifiers.verify([], query, "", [], harness.columns_of)["overall_success"]  # official: no verifier passes


# ---- the sandbox, tools and tasks ---------------------------------------------------------------------------------


def test_every_task_is_sound(world):
    """Spec 10.1: golden passes every verifier; the seed fails a feasible task and keeps an infeasible one unchanged."""
    _, template, by_mode = world
    table = stages.acceptance(by_mode["oracle"], template)
    assert table["sound"].all(), table[~table["sound"]]
    assert table["feasible"].sum() == 19 and (~table["feasible"]).sum() == 9
    assert len(TABLES) == 18 and len(T.TOOLS) >= 30 and len(T.DISTRACTORS) >= 10


def test_reset_isolation_and_independent_sessions(world):
    _, template, by_mode = world
    out = stages.reset_isolation(by_mode["oracle"], template)
    assert out["identical"] == out["pairs"] == len(by_mode["oracle"]) and out["seed_unchanged"]
    a, b = (harness.LocalSession(template, t) for t in by_mode["oracle"][1:3])
    a.call(a.names[0], {})
    assert harness.final_hash(b) == template.episode("", "x").hash()


def test_tools_enforce_permissions_state_machines_schemas_and_audit(world):
    _, template, _ = world
    conn = template.conn
    inc = conn.execute("SELECT id FROM incidents WHERE state = 'in_progress'").fetchone()[0]
    employee = conn.execute("SELECT id FROM users WHERE role_id = 'rol005'").fetchone()[0]
    ep = template.episode("usr0002", salt="t")
    before = ep.hash()
    out = T.call(ep, "itsm_update_incident_state", {"incident_id": inc, "state": "closed"})
    assert out["error"]["kind"] == "policy" and "cannot go from in_progress to closed" in out["error"]["message"]
    assert (
        T.call(ep, "itsm_update_incident_state", {"incident_id": inc, "state": "resolved"})["error"]["kind"] == "policy"
    )
    assert T.call(ep, "itsm_update_incident_state", {"incident_id": inc, "state": "done"})["error"]["kind"] == "invalid"
    assert "unexpected" in T.call(ep, "itsm_search_incidents", {"nope": 1})["error"]["message"]
    assert ep.hash() == before and ep.minted == []
    ok = T.call(ep, "itsm_update_incident_state", {"incident_id": inc, "state": "resolved", "close_notes": "x"})
    assert ok["ok"] and ep.conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0] == 1
    quiet = template.episode("usr0002", salt="t")
    assert T.call(
        quiet, "itsm_update_incident_state_legacy", {"incident_id": inc, "state": "resolved", "close_notes": "x"}
    )["ok"]
    assert quiet.conn.execute("SELECT COUNT(*) FROM audit_log").fetchone()[0] == 0  # the distractor skips the audit
    staff = template.episode(employee, salt="t")
    assert (
        T.call(staff, "itsm_update_incident_state", {"incident_id": inc, "state": "resolved", "close_notes": "x"})[
            "error"
        ]["kind"]
        == "permission"
    )
    assert "salary" not in T.call(staff, "hr_get_profile", {"user_id": employee})["result"]


def test_an_argument_that_cannot_be_encoded_is_a_failed_call_of_its_episode(world):
    """A lone surrogate (JSON's "\\ud800", which json.loads accepts) in a tool argument is refused as an invalid
    call, the database untouched; in an episode it is one failed call on record, not a UnicodeEncodeError."""
    _, template, by_mode = world
    inc = template.conn.execute("SELECT id FROM incidents WHERE state = 'in_progress'").fetchone()[0]
    ep = template.episode("usr0002", salt="t")
    before = ep.hash()
    for args in (
        {"incident_id": inc, "state": "resolved", "close_notes": "\ud800"},
        json.loads('{"incident_id": "\\udfff", "state": "resolved", "close_notes": "x"}'),
    ):
        out = T.call(ep, "itsm_update_incident_state", args)
        assert not out["ok"] and out["error"]["kind"] == "invalid" and "lone surrogate" in out["error"]["message"]
    assert ep.hash() == before and ep.minted == []

    class Surrogate:
        name = "surrogate"

        def act(self, task, session):
            args = {"incident_id": "\ud800", "state": "resolved", "close_notes": "x"}
            result = session.call("itsm_update_incident_state", args)
            return "done", [{"role": "tool", "content": result["content"][0]["text"]}]

    task = next(t for t in by_mode["oracle"] if "itsm_update_incident_state" in tasks.visible_tools(t))
    row = harness.run_episode(task, Surrogate(), local(template))
    assert row["errored"] is None and row["tool_calls"] == row["failed_calls"] == 1
    assert "lone surrogate" in row["conversation_flow"][0]["content"]


def test_symbolic_references_survive_new_ids_and_literal_replay_does_not(world):
    _, template, by_mode = world
    minted = [t for t in by_mode["oracle"] if t["eog"]["template"] == "problem_from_incident"]
    task = minted[0]
    assert "$2.result.id" in json.dumps(task["eog"]["golden_plan"])
    assert harness.run_episode(task, A.Golden(), local(template))["overall_success"]
    assert harness.run_episode(task, A.GoldenGuided(), local(template))["overall_success"]
    assert not harness.run_episode(task, A.GoldenGuided(rewrite=False), local(template))["overall_success"]
    assert tasks.resolve("$1.result.items.0.id", {1: {"items": [{"id": "x"}]}}) == "x"
    assert tasks.resolve("$3.result.id", {1: {}}) == "$3.result.id"
    assert tasks.render("got {$1.result.a} and {$2.result.b}", {1: {"a": 5}}) == "got 5 and ?"


def test_modes_add_distractors_and_the_agent_never_sees_the_sql_runner(world):
    _, template, by_mode = world
    for m, extra in (("oracle", 0), ("plus_5", 5), ("plus_10", 10)):
        for t in by_mode[m]:
            assert len(t["selected_tools"]) == len(t["eog"]["oracle_tools"]) + extra
            names = [s["function"]["name"] for s in harness.LocalSession(template, t).specs()]
            assert not set(T.HIDDEN) & set(names) and "sql" not in json.dumps(names)
    task = dict(by_mode["oracle"][0], restricted_tools=[by_mode["oracle"][0]["eog"]["golden_plan"][0]["tool"]])
    assert not harness.run_episode(task, A.Golden(), local(template))["overall_success"]


def test_a_task_in_the_official_column_layout_runs(world):
    _, template, by_mode = world
    row = {k: v for k, v in by_mode["oracle"][5].items()}
    raw = {
        **row,
        "verifiers": json.dumps(row["verifiers"]),
        "gym_servers_config": json.dumps(row["gym_servers_config"]),
    }
    hf_columns = {
        "task_id",
        "domain",
        "system_prompt",
        "user_prompt",
        "selected_tools",
        "restricted_tools",
        "mcp_endpoint",
    }
    hf_columns |= {"number_of_runs", "reset_database_between_runs", "gym_servers_config", "verifiers"}
    assert hf_columns <= set(raw) and isinstance(raw["verifiers"], str)
    loaded = tasks.load_task(raw)
    assert harness.run_episode(loaded, A.Golden(), local(template))["overall_success"]


# ---- the HTTP endpoint and MCP ------------------------------------------------------------------------------------


def test_endpoint_speaks_chat_completions_and_the_harness_retries(world):
    _, template, by_mode = world
    task = by_mode["oracle"][3]
    model = endpoint.ScriptedModel([task], http_errors=1)
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": task["user_prompt"]}],
        "tools": [],
    }
    with endpoint.Endpoint(model) as url:
        with pytest.raises(harness.HarnessError, match="HTTP 503"):
            harness.post_json(url + "/chat/completions", body, retries=0)
        reply, retried = harness.post_json(url + "/chat/completions", body, retries=2)
    assert retried == 0 and reply["object"] == "chat.completion"
    msg = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "tool_calls" and msg["tool_calls"][0]["type"] == "function"
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"])["unexpected"] == 1  # the injected bad call
    rec = mock_run(template, [task], endpoint.ScriptedModel([task], http_errors=0))[0]
    assert rec["overall_success"] and rec["failed_calls"] == 1
    never = endpoint.ScriptedModel([task], http_errors=10)
    with endpoint.Endpoint(never) as url:
        agent = harness.ReactAgent(url, "m", retries=2)
        assert harness.run_episode(task, agent, local(template))["errored"].endswith("after 3 attempt(s)")


def test_mcp_server_with_the_official_client_and_the_database_api(world):
    pytest.importorskip("mcp")
    from mcp import Client

    from paperflow.enterpriseops_gym import mcp_server

    sql, template, by_mode = world
    task = next(t for t in by_mode["plus_5"] if t["eog"]["template"] == "create_incident")
    with mcp_server.GymServer() as server:
        init = mcp_server._http().post(
            server.url + "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2024-11-05",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "0"},
                },
            },
            headers={"Accept": "application/json, text/event-stream"},
        )
        assert init.status_code == 200 and init.json()["result"]["protocolVersion"] == "2024-11-05"

        async def listing():
            async with Client(server.url + "/mcp", mode="legacy") as c:
                return await c.list_tools()

        listed = asyncio.run(listing())
        offered = {t.name: t.input_schema for t in listed.tools}
        assert (
            offered.keys() == T.CATALOGUE.keys()
            and offered["itsm_create_incident"] == T.TOOLS["itsm_create_incident"].parameters
        )
        assert not set(T.HIDDEN) & offered.keys()
        loop = mcp_server.Loop()
        try:
            rec = harness.run_episode(task, A.Golden(), lambda t: mcp_server.McpSession(server.url, sql, t, loop))
            local_rec = harness.run_episode(task, A.Golden(), local(template))
            assert rec["overall_success"] and rec["final_db_hash"] == local_rec["final_db_hash"]
            session = mcp_server.McpSession(server.url, sql, task, loop, run=7)
            refused = session.call("itsm_create_incident", {"caller_id": "nobody"})
            assert refused["isError"] and "required" in refused["content"][0]["text"]
            assert session.query("SELECT COUNT(*) AS n FROM incidents") == [{"n": 30}]
            session.close()
        finally:
            loop.close()
        with pytest.raises(RuntimeError, match="404"):
            mcp_server.http_json(
                "POST", server.url + "/api/sql-runner", {"query": "SELECT 1", "database_id": session.database_id}
            )


# ---- what holds by construction: tests, each with the near miss it must reject ---------------------------------------


def feasible_success(ep, agent):
    g = ep[(ep["agent"] == agent) & ep["feasible"]]
    return g.groupby("mode")["overall_success"].min()


def test_golden_replay_solves_every_feasible_task_in_every_mode_and_literal_replay_does_not(episodes):
    """Formerly claim S1: the verifiers are satisfiable; the recorded trajectory replayed with its ids literally is a
    near miss that they reject."""
    assert feasible_success(episodes, "golden").to_dict() == dict.fromkeys(MODES, True)
    assert not feasible_success(episodes, "golden_literal").any()


def test_the_noop_agent_fails_every_feasible_task_declines_every_infeasible_one_and_changes_nothing(episodes, world):
    """Formerly claims S2: the verifiers reject doing nothing; refusal needs a decline; a side effect is seen."""
    _, template, by_mode = world
    noop = episodes[episodes["agent"] == "noop"]
    assert not noop[noop["feasible"]]["overall_success"].any()
    assert noop[~noop["feasible"]]["refused_correctly"].all() and not noop["side_effect"].any()
    # near misses: trivially true (empty) verifier sets let the no-op "succeed"; random never declines; a no-op that
    # notifies the user leaves a side effect
    trivial = {m: [dict(t, verifiers=[]) for t in by_mode[m]] for m in MODES}
    assert frame(run_all(template, trivial, A.Noop())).query("feasible")["overall_success"].all()
    rnd = episodes[(episodes["agent"] == "random") & ~episodes["feasible"]]
    assert not rnd["refused_correctly"].any()

    @dataclass_agent
    def chatty(task, session):
        session.call("send_notification", {"recipient_id": "usr0001", "subject": "x", "body": "I cannot help"})
        return "I cannot help.", []

    allowed = {
        m: [dict(t, selected_tools=t["selected_tools"] + ["send_notification"]) for t in by_mode[m]] for m in MODES
    }
    chatty_rows = frame(run_all(template, allowed, chatty))
    assert chatty_rows.query("not feasible")["side_effect"].all()


def test_verifier_pass_rate_is_at_least_success_for_every_agent(episodes):
    """Formerly claim S5 (an identity of the scoring): success needs every verifier to pass. Scoring success as "any
    verifier passes" breaks it."""
    rates = episodes.groupby("agent")[["verifier_pass_rate", "overall_success"]].mean()
    assert (rates["verifier_pass_rate"] >= rates["overall_success"]).all()
    broken = episodes.assign(overall_success=episodes["verifiers_passed"] > 0)
    rates = broken.groupby("agent")[["verifier_pass_rate", "overall_success"]].mean()
    assert (rates["verifier_pass_rate"] < rates["overall_success"]).any()


def test_the_scripted_model_over_http_ends_in_golden_replays_database_and_a_stubborn_one_does_not(episodes, world):
    """Formerly claim S6: the HTTP endpoint and the harness replay golden exactly (after the injected 503 and the
    injected bad call); a model that does not recover from its bad call ends elsewhere."""
    _, template, by_mode = world
    key = ["mode", "task_id"]
    golden = episodes[episodes["agent"] == "golden"].set_index(key)["final_db_hash"]
    mock = episodes[episodes["agent"] == "mock_llm"].set_index(key)["final_db_hash"]
    assert len(mock) == len(golden) and (mock == golden.loc[mock.index]).all()

    class Stubborn(endpoint.ScriptedModel):
        def reply(self, body):
            if any(m["role"] == "tool" for m in body["messages"]):
                return self._message({"role": "assistant", "content": "Done."})
            return super().reply(body)

    all_tasks = [t for m in MODES for t in by_mode[m]]
    stubborn = frame(mock_run(template, all_tasks, Stubborn(all_tasks, http_errors=0))).set_index(key)
    assert (stubborn["final_db_hash"] != golden.loc[stubborn.index]).any()


# ---- claims and their negative controls ---------------------------------------------------------------------------


def claim_map(ep, mutants=None, seeds=(0, 1), alternatives=None):
    """The config's claims judged on the metrics table of these episodes and mutants (world seed 0)."""
    if mutants is None:
        mutants = pd.DataFrame({"task_id": ["a"], "caught": [True], "caught_row_count_only": [False]})
    if alternatives is None:
        alternatives = pd.DataFrame({"task_id": ["a"], "accepted": [True], "trajectory_match": [False]})
    table = claims.metrics_table(ep, mutants, 0, list(seeds), MODES, "smoke", alternatives)
    specs = parse_claims(load_paper_config("enterpriseops_gym", "smoke")["claims"], "config/enterpriseops_gym.yaml")
    return {v.id: v for v in judge_all(specs, table, "smoke")}


def test_the_gated_claims_on_the_real_runs_and_their_controls(episodes, world):
    _, template, by_mode = world
    mutants = mutation.mutation_test(by_mode["oracle"], template, 0)
    alts = alternatives.check_alternatives(by_mode["oracle"], template)
    got = claim_map(episodes, mutants, alternatives=alts)
    gated = {k: v.verdict for k, v in got.items() if v.gated}
    assert set(gated) == {
        "S3_random_at_most_10pct",
        "S3_heuristic_between_random_and_golden",
        "S4_distractors_cost_heuristic",
        "mutation_test_catches_plan_errors",
        "alternative_plans_accepted",
    }
    # the mutation test is the central claim where no language model runs; the alternatives claim is gated only
    assert got["mutation_test_catches_plan_errors"].central and not got["alternative_plans_accepted"].central
    held = ["S3_random_at_most_10pct", "S3_heuristic_between_random_and_golden", "alternative_plans_accepted"]
    assert {k: gated[k] for k in held} == dict.fromkeys(held, HELD)
    for k in held:  # each control is judged beside its claim and fails it
        assert got[k].control["verdict"] == REFUTED, k
    assert got["mutation_test_catches_plan_errors"].control["verdict"] == REFUTED  # row counts alone miss values


def _swap(ep, agent, replacement):
    other = ep[(ep["agent"] == replacement) & (ep["run"] == 0)].assign(agent=agent)  # one run: one seed
    return pd.concat([ep[ep["agent"] != agent], other], ignore_index=True)


def test_negative_controls_fail_their_claims(episodes):
    # S3: golden in random's place, golden in the heuristic's place
    ep = _swap(episodes, "random", "golden").assign(run=0)
    assert not claim_map(ep, seeds=(0,))["S3_random_at_most_10pct"].held
    assert not claim_map(_swap(episodes, "heuristic", "golden"))["S3_heuristic_between_random_and_golden"].held
    # S4: modes exchanged, so the distractors "help"
    h = episodes["agent"] == "heuristic"
    swapped = episodes.copy()
    swapped.loc[h, "mode"] = swapped.loc[h, "mode"].map({"oracle": "plus_10", "plus_10": "oracle", "plus_5": "plus_5"})
    assert claim_map(episodes)["S4_distractors_cost_heuristic"].value < 0
    assert claim_map(swapped)["S4_distractors_cost_heuristic"].value > 0
    assert not claim_map(swapped)["S4_distractors_cost_heuristic"].held


def test_errored_episodes_count_as_failures_as_the_official_compute_score(episodes):
    """An episode that errored (its endpoint failed past the retries) stays in every rate as a failure."""
    golden = episodes[(episodes["agent"] == "golden") & (episodes["mode"] == "oracle")]
    broken = episodes.copy()
    first = golden.index[golden["feasible"]][0]
    infeasible = golden.index[~golden["feasible"]][0]
    broken.loc[[first, infeasible], "errored"] = "HTTP 503 after 5 attempt(s)"
    scored = metrics.summary(broken[broken["agent"] == "golden"], ["mode"]).set_index("mode").loc["oracle"]
    n_feasible, n_infeasible = int(golden["feasible"].sum()), int((~golden["feasible"]).sum())
    assert scored["errored"] == 2
    assert scored["feasible_success"] == pytest.approx((n_feasible - 1) / n_feasible)
    assert scored["refusal_accuracy"] == pytest.approx((n_infeasible - 1) / n_infeasible)
    assert scored["verifier_pass_rate"] == pytest.approx((n_feasible - 1) / n_feasible)
    table = claims.metrics_table(broken, pd.DataFrame(), 0, [0, 1], MODES, "smoke")
    rows = table[(table["method"] == "golden") & (table["metric"] == "oracle/success")]
    assert len(rows) == n_feasible and rows["value"].sum() == n_feasible - 1


def test_a_missing_value_gives_no_data_not_a_verdict(episodes):
    broken = episodes.copy()
    first = broken.index[(broken["agent"] == "random") & broken["feasible"] & (broken["mode"] == "oracle")][0]
    broken["overall_success"] = broken["overall_success"].astype(object)
    broken.loc[first, "overall_success"] = None
    got = claim_map(broken)
    assert got["S3_random_at_most_10pct"].verdict == NO_DATA
    assert not got["S3_random_at_most_10pct"].held


def dataclass_agent(fn):
    """A function as an agent named noop (for the side-effect control)."""

    class _Agent:
        name = "noop"

        def act(self, task, session):
            return fn(task, session)

    return _Agent()


def test_mutation_test_catches_most_mutants_and_fails_with_count_only_verifiers(world):
    _, template, by_mode = world
    real = mutation.mutation_test(by_mode["oracle"], template, 0)
    assert len(real) > 50 and real[real["kind"] == "drop"]["caught"].all()
    weak = [
        dict(t, verifiers=[v for v in t["verifiers"] if "row count" in v.get("name", "")]) for t in by_mode["oracle"]
    ]
    weak_mutants = mutation.mutation_test(weak, template, 0)
    share = lambda m, column="caught": m.groupby("task_id")[column].all().mean()  # noqa: E731
    assert share(weak_mutants) < 0.95 and share(real) > share(weak_mutants)
    # the control's column: the row-count verifiers alone, on the same mutants, catch fewer than every verifier
    assert share(real, "caught_row_count_only") == share(weak_mutants) < share(real)
    rng = random.Random(0)
    assert mutation.perturb("new", {"enum": ["new", "closed"]}, {}, rng) == "closed"
    assert mutation.perturb(2, {"type": "integer", "minimum": 1, "maximum": 2}, {}, rng) == 1


def test_alternative_orders_respect_references_and_the_order_of_writes():
    step = lambda tool, **args: {"tool": tool, "args": args}  # noqa: E731
    three_lookups = [
        step("itsm_search_incidents", number="INC1"),
        step("itsm_find_group", name="g"),
        step("find_user", email="a@b"),
        step("itsm_assign_incident", incident_id="$1.result.items.0.id", group_id="$2.result.items.0.id"),
    ]
    assert alternatives.reordered(three_lookups) == [3, 2, 1, 4]
    chain = [step("find_user", email="a@b"), step("hr_get_profile", user_id="$1.result.items.0.id")]
    assert alternatives.reordered(chain) is None
    # writes keep their order, and a write waits for the reads before it (offboarding: returns before termination)
    offboard = [
        step("find_user", email="a@b"),
        step("itsm_search_assets", assigned_to="$1.result.items.0.id"),
        step("itsm_return_asset", asset_id="$2.result.items.0.id"),
        step("hr_set_employment_status", user_id="$1.result.items.0.id", status="terminated"),
    ]
    assert alternatives.reordered(offboard) is None
    moved, final = alternatives._apply(three_lookups, "{$1.result.items.0.number}", [3, 2, 1, 4])
    assert moved[3]["args"] == {"incident_id": "$3.result.items.0.id", "group_id": "$2.result.items.0.id"}
    assert final == "{$3.result.items.0.number}"


def test_alternative_plans_pass_the_verifiers_and_fail_trajectory_matching_and_stricter_checks(world, monkeypatch):
    sql, template, by_mode = world
    alts = alternatives.check_alternatives(by_mode["oracle"], template)
    assert len(alts) == 19 and set(alts["kind"]) == {"reorder", "route", "detour"}
    assert alts["accepted"].all() and not alts["trajectory_match"].any()
    # trajectory matching is a real checker: golden replay matches itself
    task = by_mode["oracle"][0]
    replays = [
        tasks.replay(template.episode(task["eog"]["actor"], task["task_id"]), task["eog"]["golden_plan"], "")[0]
        for _ in range(2)
    ]
    assert alternatives._signature(replays[0]) == alternatives._signature(replays[1])
    # verifiers derived as a naive diff (minted ids compared literally, ids, numbers and timestamps kept) pin the ids
    # golden replay's server minted: they reject the valid alternatives, so the claim can fail
    monkeypatch.setattr(tasks, "VOLATILE", re.compile(r"(?!)"))
    monkeypatch.setattr(tasks, "_ref_expr", lambda table, col, value, ref, conn: (f"{table}.{col}", value))
    strict = tasks.build_tasks(sql, 19, 9, 0, ["oracle"]).modes["oracle"]
    strict = alternatives.check_alternatives([tasks.load_task(json.loads(json.dumps(r))) for r in strict], template)
    assert strict["accepted"].mean() < 0.95


# ---- config -------------------------------------------------------------------------------------------------------


def _config(tmp_path):
    """A scratch root with this paper's config and schema (load_paper_config reads config/ under it)."""
    import shutil

    from paperflow.core.config import repo_root

    root = tmp_path / "repo"
    (root / "config" / "schemas").mkdir(parents=True)
    for schema in ("enterpriseops_gym.schema.yaml", "claims.schema.yaml"):
        shutil.copy(repo_root() / "config/schemas" / schema, root / "config/schemas/")
    shutil.copy(repo_root() / "config/enterpriseops_gym.yaml", root / "config/")
    return root


def test_config_errors_name_the_key_and_the_allowed_values(tmp_path):
    assert load_paper_config("enterpriseops_gym", "smoke")["agents"][-1] == "mock_llm"
    root = _config(tmp_path)
    path = root / "config/enterpriseops_gym.yaml"
    text = path.read_text()
    path.write_text(text.replace("smoke: {}", "smoke: {modes: [oracle, plus_20]}"))
    with pytest.raises(
        ConfigError, match=r"smoke.modes\[1\] = 'plus_20' is not allowed; allowed values: 'oracle', 'plus_5', 'plus_10'"
    ):
        load_paper_config("enterpriseops_gym", "smoke", root)
    path.write_text(text.replace("smoke: {}", "smoke: {agents: [noop, golden]}"))
    with pytest.raises(ConfigError, match=r"agents lacks \['random', 'heuristic', 'mock_llm'\]"):
        load_paper_config("enterpriseops_gym", "smoke", root)
    path.write_text(text.replace("smoke: {}", "smoke: {tasks: {n_infeasible: 2}}"))
    with pytest.raises(ConfigError, match=r"tasks.n_infeasible \(2\) must be >= 3"):
        load_paper_config("enterpriseops_gym", "smoke", root)
    path.write_text(text.replace("smoke: {}", "smoke: {mock_llm: {transport: grpc}}"))
    with pytest.raises(ConfigError, match="allowed values: 'mcp', 'inprocess'"):
        load_paper_config("enterpriseops_gym", "smoke", root)


def test_the_synthetic_download_refuses_the_official_source_by_name(tmp_path):
    cfg = load_paper_config("enterpriseops_gym", "paper")
    with pytest.raises(ConfigError, match=r"source.kind 'official'.*paper.smk.*source.kind: synthetic"):
        stages.download(cfg["source"], cfg["world"], tmp_path / "seed.sql")
    assert not (tmp_path / "seed.sql").exists()
