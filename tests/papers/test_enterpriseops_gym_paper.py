"""enterpriseops_gym at paper scale, offline: the official task set as Hub parquet files in the dataset's column
layout (configs = modes, splits = domains, its card's `configs:` block) fetched only at the pinned commit, an unpinned
one refused with `paperflow pin enterpriseops_gym` named; gym_dbs.zip served over loopback HTTP and checked against
its sha256 and its git blob id; preprocess resolving seed files and server URLs; the official harness's protocol end
to end (seed-database, MCP JSON-RPC with context headers, tools merged and filtered, sql-runner verifiers, the judge
prompt) with our MCP server standing in for the official domain servers and a scripted model behind an
OpenAI-compatible endpoint; errored samples retried, counted, and scored as failures; the vLLM command line and server lifetime
against a fake server; the per-domain/per-mode tables; the paper-scale DAG with a GPU on the served model's run only.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import zipfile
from pathlib import Path

import pandas as pd
import pytest
from fake_hub import FakeHub, install

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.enterpriseops_gym import endpoint, harness, official, tasks
from paperflow.enterpriseops_gym.mcp_server import GymServer
from paperflow.enterpriseops_gym.sandbox import WorldSize, world_sql

SHA = "0123456789abcdef0123456789abcdef01234567"
HUB = "ServiceNow-AI/EnterpriseOps-Gym"
SERVER = "eog-mcp"
SQL_REL = f"{official.DB_ROOT}/itsm/dbs/db_seed_0.sql"
MODES = ("oracle", "plus_10_tools")
OUR_MODE = {"oracle": "oracle", "plus_10_tools": "plus_10"}


def official_row(task, mode, server=SERVER):
    """One of our generated tasks in the dataset's column layout: JSON text columns, nested validation_config,
    gym_name on every verifier (our collateral `unchanged` checks have no official form and are dropped)."""
    checks = []
    for v in task["verifiers"]:
        if v["verifier_type"] == "unchanged":
            continue
        cfg = {k: x for k, x in v.items() if k not in ("verifier_type", "name", "judge_rule")}
        checks.append(
            {"verifier_type": v["verifier_type"], "name": v["name"], "gym_name": server, "validation_config": cfg}
        )
    gym = {
        "mcp_server_name": server,
        "mcp_server_url": "http://localhost:8006",
        "seed_database_file": SQL_REL,
        "context": {"x-user-id": task["eog"]["actor"]},
    }
    return {
        "task_id": f"{task['task_id']}__{mode}",
        "domain": task["domain"],
        "system_prompt": task["system_prompt"],
        "user_prompt": task["user_prompt"],
        "selected_tools": list(task["selected_tools"]),
        "restricted_tools": list(task["restricted_tools"]) or None,
        "mcp_endpoint": "/mcp",
        "number_of_runs": 1,
        "reset_database_between_runs": True,
        "gym_servers_config": json.dumps([gym]),
        "verifiers": json.dumps(checks),
    }


@pytest.fixture(scope="module")
def world():
    """Our sandbox's seed SQL, a few feasible tasks per domain (generated with golden plans) and their official rows."""
    sql = world_sql(0, WorldSize())
    ts = tasks.build_tasks(sql, 12, 3, 0, list(OUR_MODE.values()))
    picked = {}
    for mode, ours in OUR_MODE.items():
        loaded = [tasks.load_task(json.loads(json.dumps(r))) for r in ts.modes[ours]]
        feasible = [t for t in loaded if t["eog"]["feasible"]]
        by_domain = {}
        for t in feasible:
            by_domain.setdefault(t["domain"], []).append(t)
        picked[mode] = [t for d in sorted(by_domain) for t in by_domain[d][:2]]
    rows = {m: [official_row(t, m) for t in picked[m]] for m in MODES}
    return sql, picked, rows


def domains_of(rows):
    return sorted({r["domain"] for rs in rows.values() for r in rs})


@pytest.fixture
def hub(world, tmp_path, monkeypatch):
    """A fake Hub: download_pretrained writes the files of the dataset matching allow_patterns (the card and the
    parquet shards, at the paths its `configs:` block names) and records the call."""
    _, _, rows = world
    files = {}
    card = ["---", "license: cc-by-nc-4.0", "configs:"]
    for mode in MODES:
        card += [f"  - config_name: {mode}", "    data_files:"]
        for domain in domains_of(rows):
            rel = f"data/{mode}/{domain}-00000-of-00001.parquet"
            card += [f"      - split: {domain}", f"        path: data/{mode}/{domain}-*"]
            buf = io.BytesIO()
            pd.DataFrame([r for r in rows[mode] if r["domain"] == domain]).to_parquet(buf, index=False)
            files[rel] = buf.getvalue()
    files["README.md"] = ("\n".join([*card, "---", "# EnterpriseOps-Gym"]) + "\n").encode()
    files["data/unused/extra.bin"] = b"not asked for"
    return install(monkeypatch, FakeHub(dataset=files)).calls, tmp_path / "cache"


def dataset(revision=SHA):
    return {"hub": HUB, "repo_type": "dataset", "revision": revision, "files": ["README.md", "*.parquet"]}


def test_the_task_set_is_fetched_at_the_pinned_commit_in_its_column_layout(world, hub, tmp_path):
    _, _, rows = world
    calls, cache = hub
    outputs = {m: str(tmp_path / "raw" / f"{m}.jsonl") for m in MODES} | {"meta": str(tmp_path / "raw" / "t.json")}
    doc = official.download_tasks(dataset(), MODES, domains_of(rows), str(cache), outputs)
    assert [c["revision"] for c in calls] == [SHA] and calls[0]["repo_type"] == "dataset"
    assert "data/unused/extra.bin" not in calls[0]["written"] and "README.md" in calls[0]["written"]
    assert doc["folder"].endswith(f"datasets/ServiceNow-AI--EnterpriseOps-Gym/{SHA}")
    for mode in MODES:
        got = official.read_jsonl(outputs[mode])
        assert sorted(r["task_id"] for r in got) == sorted(r["task_id"] for r in rows[mode])
        first = got[0]
        assert isinstance(first["gym_servers_config"], list) and isinstance(first["verifiers"], list)
        assert first["mode"] == mode and first["restricted_tools"] == []
        assert doc["rows"][mode] == {d: sum(r["domain"] == d for r in rows[mode]) for d in domains_of(rows)}
    # without a card, the push_to_hub layout <config>/<split>-*.parquet is read
    bare = tmp_path / "bare"
    (bare / "oracle").mkdir(parents=True)
    pd.DataFrame(rows["oracle"][:1]).to_parquet(bare / "oracle" / "itsm-00000-of-00001.parquet")
    assert [p.name for p in official.split_files(bare, "oracle", "itsm")] == ["itsm-00000-of-00001.parquet"]
    with pytest.raises(FileNotFoundError, match="config 'oracle' split 'hr'"):
        official.split_files(bare, "oracle", "hr")


def test_an_unpinned_task_set_or_model_is_refused_with_the_pin_command_named(hub, tmp_path, monkeypatch):
    from paperflow.core import download
    from paperflow.core import hub as core_hub

    calls, cache = hub
    monkeypatch.setattr(core_hub, "read_lock_revisions", lambda slug, root=None: {})
    monkeypatch.delenv(download.PIN_ENV, raising=False)
    with pytest.raises(UnpinnedDownload, match=r"source\.tasks\.revision .*`paperflow pin enterpriseops_gym`"):
        official.download_tasks(dataset(None), MODES, ["itsm"], str(cache), {})
    model = load_paper_config("enterpriseops_gym", "paper")["official"]["models"]["qwen3_4b"]
    with pytest.raises(UnpinnedDownload, match=r"official\.models\.qwen3_4b\.revision .*`paperflow pin"):
        download_model(
            {**model, "revision": None},
            slug="enterpriseops_gym",
            key="official.models.qwen3_4b.revision",
            cache=str(cache),
            out=str(tmp_path / "m.json"),
        )
    with pytest.raises(ConfigError, match="not a pinned revision"):
        download_model(
            {**model, "revision": "main"},
            slug="enterpriseops_gym",
            key="official.models.qwen3_4b.revision",
            cache=str(cache),
            out=str(tmp_path / "m.json"),
        )
    assert calls == []


def zipped(sql: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(SQL_REL, sql)
    return buf.getvalue()


def test_gym_dbs_is_checked_by_sha256_and_git_blob_id_then_unzipped(world, tmp_path, serve_bytes, monkeypatch):
    import hashlib

    from paperflow.core import download

    sql, _, _ = world
    payload = zipped(sql)
    (tmp_path / "z.zip").write_bytes(payload)
    blob = subprocess.run(["git", "hash-object", str(tmp_path / "z.zip")], capture_output=True, text=True, check=True)
    assert official.git_blob_sha1(tmp_path / "z.zip") == blob.stdout.strip()
    base, hits = serve_bytes(payload)
    dbs = {"url": base + "/gym_dbs.zip", "sha256": hashlib.sha256(payload).hexdigest(), "git_blob": blob.stdout.strip()}
    doc = official.download_dbs(dbs, str(tmp_path / "cache"), str(tmp_path / "dbs.json"))
    assert doc["sql_files"] == 1 and (Path(doc["folder"]) / SQL_REL).read_text() == sql and hits == ["/gym_dbs.zip"]
    with pytest.raises(ConfigError, match=r"source\.dbs\.git_blob: .* has git blob id"):
        official.download_dbs({**dbs, "git_blob": "f" * 40}, str(tmp_path / "c2"), str(tmp_path / "d2.json"))
    assert not (tmp_path / "c2" / "gym_dbs" / ("f" * 40 + ".zip")).exists()
    monkeypatch.setattr(download, "read_lock", lambda slug, root=None: {})
    monkeypatch.delenv(download.PIN_ENV, raising=False)
    with pytest.raises(UnpinnedDownload, match=r"source\.dbs\.sha256 .*`paperflow pin enterpriseops_gym`"):
        official.download_dbs({**dbs, "sha256": None}, str(tmp_path / "c3"), str(tmp_path / "d3.json"))


def prepared(world, tmp_path, server_url, mode="oracle"):
    """raw JSONL -> preprocess with the unzipped seed folder and `official.servers`; the mode's runnable tasks."""
    sql, _, rows = world
    root = tmp_path / "dbs"
    (root / SQL_REL).parent.mkdir(parents=True, exist_ok=True)
    (root / SQL_REL).write_text(sql)
    (tmp_path / "dbs.json").write_text(json.dumps({"folder": str(root)}))
    raw = tmp_path / f"raw_{mode}.jsonl"
    official.write_jsonl(raw, [{**tasks.load_task(r), "mode": mode} for r in rows[mode]])
    out = tmp_path / f"tasks_{mode}.jsonl"
    official.preprocess(str(raw), str(tmp_path / "dbs.json"), {SERVER: server_url}, str(out))
    return official.read_jsonl(out)


def test_preprocess_resolves_seed_files_and_server_urls_and_names_what_is_missing(world, tmp_path):
    got = prepared(world, tmp_path, "http://127.0.0.1:9")
    gym = got[0]["gym_servers_config"][0]
    assert gym["mcp_server_url"] == "http://127.0.0.1:9" and Path(gym["seed_database_file"]).is_file()
    raw = tmp_path / "raw_oracle.jsonl"
    with pytest.raises(ConfigError, match=r"official.servers has no URL for server 'eog-mcp'"):
        official.preprocess(str(raw), str(tmp_path / "dbs.json"), {"gym-itsm-mcp": "http://x"}, str(tmp_path / "o"))
    (tmp_path / "dbs.json").write_text(json.dumps({"folder": str(tmp_path / "nowhere")}))
    with pytest.raises(FileNotFoundError, match="seed database"):
        official.preprocess(str(raw), str(tmp_path / "dbs.json"), {SERVER: "http://x"}, str(tmp_path / "o"))


def unwrap(message):
    """The scripted model reads the tool text inside the official ToolMessage's MCP result JSON."""
    if message["role"] != "tool":
        return message
    envelope = json.loads(message["content"])
    assert set(envelope) >= {"content", "isError"}, envelope  # what react.py puts in a ToolMessage
    return {**message, "content": "".join(c["text"] for c in envelope["content"])}


class JudgedModel:
    """The scripted model (golden plans, one injected HTTP 503, one bad call) that also answers the official judge
    prompt: score 9 when the SQL result's value is in the judged answer, else 2."""

    def __init__(self, scripted, judge_calls):
        self.scripted, self.judge_calls = scripted, judge_calls
        self.requests = 0

    def fail_now(self):
        return self.scripted.fail_now()

    def reply(self, body):
        system = body["messages"][0]["content"]
        if system != official.JUDGE_SYSTEM:
            return self.scripted.reply({**body, "messages": [unwrap(m) for m in body["messages"]]})
        user = body["messages"][1]["content"]
        self.judge_calls.append(user)
        shown, rest = user.split("Database Query Result:\n")[1].split("\n\nAI Assistant Response:\n")
        answer = rest.split("\n\nComparison Task:")[0]
        values = [str(v) for row in json.loads(shown)["rows"] for v in row.values()]
        score = 9 if values and all(v in answer for v in values) else 2
        text = "```json\n" + json.dumps({"score": score, "reasoning": "scripted"}) + "\n```"
        return self.scripted._message({"role": "assistant", "content": text})


@pytest.fixture(scope="module")
def served(world):
    with GymServer() as server:
        yield server


def test_the_official_protocol_runs_end_to_end_and_the_scripted_model_solves_every_task(world, served, tmp_path):
    _, picked, _ = world
    runnable = prepared(world, tmp_path, served.url)
    judge_calls = []
    model = JudgedModel(endpoint.ScriptedModel(picked["oracle"], bad_step=0, http_errors=1), judge_calls)
    with endpoint.Endpoint(model) as url:
        agent = harness.ReactAgent(url, "scripted", max_iterations=50, retries=5, name="scripted")
        judge = official.LlmJudge(url, "scripted")
        records = official.run_official(runnable, agent, judge, runs=2)
    assert len(records) == 2 * len(runnable) and {r["run"] for r in records} == {0, 1}
    assert all(r["errored"] is None and r["overall_success"] for r in records), [
        (r["task_id"], r["verification_summary"]) for r in records if not r["overall_success"]
    ]
    assert agent.usage["retries"] == 1  # the injected 503 was retried
    assert all(r["failed_calls"] >= 1 for r in records)  # the injected bad call was refused by the server
    kinds = {v["type"] for r in records for v in r["verification_summary"]["results"].values()}
    assert kinds == {"database_state", "response_check", "tool_execution"}
    assert judge_calls and all("Comparison Task:" in c for c in judge_calls)  # the official judge prompt
    assert not served.databases  # every episode's database was deleted
    # the same tasks with a model that does nothing: the state verifiers fail
    with endpoint.Endpoint(endpoint.ScriptedModel([], http_errors=0)) as url:
        idle = harness.ReactAgent(url, "idle", name="idle")
        failed = official.run_official(runnable, idle, official.LlmJudge(url, "idle"), runs=1)
    assert all(r["errored"] is None and not r["overall_success"] for r in failed)


def test_tools_merge_across_servers_first_wins_and_restricted_tools_are_dropped(world, served, tmp_path):
    task = prepared(world, tmp_path, served.url)[0]
    second = {**task["gym_servers_config"][0], "mcp_server_name": "eog-second"}
    allowed = task["selected_tools"]
    task = {**task, "gym_servers_config": [task["gym_servers_config"][0], second], "restricted_tools": allowed[:1]}
    session = official.OfficialSession(task)
    try:
        assert set(session.clients) == {SERVER, "eog-second"}
        assert len({c.database_id for c in session.clients.values()}) == 2  # one fresh database per server
        assert set(session.route.values()) == {SERVER}
        assert session.names == [n for n in session.tools if n in allowed[1:]]
        assert [s["function"]["name"] for s in session.specs()] == session.names
        refused = session.call(allowed[0], {})
        assert refused["isError"] and "not available" in json.loads(refused["content"][0]["text"])["content"][0]["text"]
        assert session.client_for("eog-second").sql("SELECT COUNT(*) AS n FROM users")["success"]
        verdict = official.verify_official(
            [{"verifier_type": "database_state", "name": "v", "gym_name": "absent", "validation_config": {}}],
            session,
            "",
            None,
        )
        assert verdict["skipped"] == ["v"] and verdict["total"] == 0 and verdict["overall_success"]
    finally:
        session.close()
    assert not served.databases


def test_official_extraction_and_comparisons():
    ok = lambda rows: {"success": True, "result": {"rows": rows}}  # noqa: E731
    assert official.extract_value(ok([{"n": 1}])) == 1
    assert official.extract_value(ok([{"a": 1, "b": 2}])) == {"a": 1, "b": 2}
    assert official.extract_value(ok([{"a": 1}, {"a": 2}])) == [{"a": 1}, {"a": 2}]
    assert official.extract_value(ok([])) == []
    assert official.extract_value({"success": True, "result": {"data": [{"x": "y"}]}}) == "y"
    assert official.extract_value({"success": False}) is None
    assert official.compare_values(1, 1, "equals") and not official.compare_values("1", 1, "equals")
    assert official.compare_values(3, 2, "greater_than") and not official.compare_values("3", 2, "greater_than")
    assert official.compare_values({"a": "xyz"}, "xy", "contains") and not official.compare_values(1, 1, "between")


def test_an_endpoint_that_keeps_failing_errors_the_sample_after_its_attempts(world, served, tmp_path):
    runnable = prepared(world, tmp_path, served.url)[:1]
    with endpoint.Endpoint(endpoint.ScriptedModel([], http_errors=100)) as url:
        agent = harness.ReactAgent(url, "down", retries=0, name="down")
        records = official.run_official(runnable, agent, None, runs=1, attempts=2)
    (rec,) = records
    assert rec["errored"] and "HTTP 503" in rec["errored"] and rec["attempts"] == 2 and not rec["overall_success"]
    assert not served.databases


def test_tables_per_model_mode_and_domain_score_errored_episodes_as_failures(tmp_path):
    rows = []
    for model, rate in (("m1", 1.0), ("m2", 0.5)):
        for mode in ("oracle", "plus_5_tools"):
            for domain, n in (("itsm", 2), ("hr", 4)):
                for t in range(n):
                    for run in range(2):
                        success = (t + run) % 2 == 0 if rate < 1 else True
                        rows.append(
                            {
                                "agent": model,
                                "mode": mode,
                                "domain": domain,
                                "task_id": f"{domain}{t}",
                                "run": run,
                                "errored": None,
                                "overall_success": success,
                                "verifier_pass_rate": 1.0 if success else 0.25,
                            }
                        )
    # an errored sample whose verifiers had partly passed before the error: compute_score.py scores it a failure
    rows.append({**rows[0], "run": 9, "errored": "HTTP 503", "overall_success": False, "verifier_pass_rate": 0.75})
    ep = pd.DataFrame(rows)
    t = official.official_tables(ep, ["calendar", "hr", "itsm"])
    ok = ep.assign(verifier_pass_rate=ep["verifier_pass_rate"].where(ep["errored"].isna(), 0.0))
    for _, row in t["success"].iterrows():
        g = ok[(ok["agent"] == row["model"]) & (ok["mode"] == row["mode"])]
        per = {d: 100 * g[g["domain"] == d]["overall_success"].mean() for d in ("hr", "itsm")}
        assert row["hr"] == pytest.approx(per["hr"]) and row["itsm"] == pytest.approx(per["itsm"])
        assert row["avg"] == pytest.approx(sum(per.values()) / 2)  # unweighted over the domains present
        assert row["micro"] == pytest.approx(100 * g["overall_success"].mean())
        assert pd.isna(row["calendar"])
    success = t["success"].set_index(["model", "mode"])
    assert success.loc[("m1", "oracle"), "itsm"] == pytest.approx(80.0)  # 4 of 5 episodes, the errored one failed
    assert success.loc[("m1", "plus_5_tools"), "avg"] == 100.0
    assert t["verifier_pass"].set_index(["model", "mode"]).loc[("m1", "oracle"), "itsm"] == pytest.approx(80.0)
    counts = t["counts"].set_index(["model", "mode", "domain"])
    assert (
        counts.loc[("m1", "oracle", "itsm"), "errored"] == 1 and counts.loc[("m1", "oracle", "itsm"), "episodes"] == 5
    )
    pk = t["pass_k"].set_index(["model", "mode", "domain", "k"])["pass_hat_k"]
    assert pk[("m2", "oracle", "hr", 1)] == pytest.approx(0.5) and pk[("m2", "oracle", "hr", 2)] == 0.0
    assert pk[("m1", "oracle", "itsm", 1)] == pytest.approx((2 / 3 + 1) / 2)  # the errored run fails its task
    outputs = {f"table_{k}": str(tmp_path / f"{k}.csv") for k in ("success", "verifier_pass", "pass_k", "counts")}
    outputs |= {"metrics": str(tmp_path / "metrics.json"), "report": str(tmp_path / "report.md")}
    meta = {"hub": HUB, "revision": SHA, "rows": {"oracle": {"hr": 4, "itsm": 2}}}
    metrics = official.report(ep, ["calendar", "hr", "itsm"], meta, outputs)
    assert metrics["episodes"] == len(ep) and metrics["errored"] == 1
    assert pd.read_csv(outputs["table_success"]).shape == t["success"].shape
    assert f"commit {SHA}" in Path(outputs["report"]).read_text()


def test_the_vllm_command_line_of_an_open_model():
    model = load_paper_config("enterpriseops_gym", "paper")["official"]["models"]["qwen3_4b"]
    cmd = official.vllm_command("/snap/qwen", "qwen3_4b", 8123, 2, model)
    assert cmd[:3] == ["vllm", "serve", "/snap/qwen"]
    flags = " ".join(cmd)
    for part in (
        "--served-model-name qwen3_4b",
        "--host 127.0.0.1",
        "--port 8123",
        "--tensor-parallel-size 2",
        "--enable-auto-tool-choice --tool-call-parser hermes",
        "--reasoning-parser qwen3",
        "--max-model-len 131072",
        "--enable-prefix-caching",
    ):
        assert part in flags
    assert cmd[-2] == "--hf-overrides" and json.loads(cmd[-1])["rope_parameters"]["rope_type"] == "yarn"
    assert "--generation-config" not in cmd  # vLLM's default (the model's generation_config.json), as before


def test_a_served_model_without_a_gpu_fails_naming_the_key(tmp_path):
    cfg = load_paper_config("enterpriseops_gym", "paper")
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    official.write_jsonl(tmp_path / "t.jsonl", [])
    with pytest.raises(ConfigError, match=r"official\.models\.qwen3_4b\.device"):
        official.run_model(
            "qwen3_4b",
            cfg["official"]["models"]["qwen3_4b"],
            {m: str(tmp_path / "t.jsonl") for m in cfg["official"]["modes"]},
            cfg["official"],
            None,
        )
    api = {"serve": "api", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "EOG_TEST_UNSET_KEY"}
    with pytest.raises(ConfigError, match=r"official\.models\.api\.api_key_env: .*EOG_TEST_UNSET_KEY"):
        official.run_model(
            "api", api, {m: str(tmp_path / "t.jsonl") for m in cfg["official"]["modes"]}, cfg["official"]
        )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("modes: [oracle, plus_5_tools, plus_10_tools, plus_15_tools]", "modes: [oracle, plus_20_tools]"),
            "plus_20_tools",
        ),
        (("gpu_datasets: [qwen3_4b]", "gpu_datasets: []"), r"gpu_datasets \(\[\]\) must list exactly"),
        (("        serve: vllm\n", "        serve: sglang\n"), "sglang"),
        (("      git_blob: f6475dae", "      git_blob: main"), "git_blob"),
        (('digest: "sha256:a234ae3f', 'digest: "latest:a234ae3f'), "digest"),
        (
            ("        gym-itsm-mcp: {image:", "        gym-itsm-mcp-renamed: {image:"),
            r"official\.containers\.images has no image for server\(s\) \['gym-itsm-mcp'\]",
        ),
    ],
)
def test_paper_config_errors_name_the_key(tmp_path, edit, message):
    import shutil

    from paperflow.core.config import repo_root

    root = tmp_path / "repo"
    (root / "config" / "schemas").mkdir(parents=True)
    for schema in ("enterpriseops_gym", "claims"):
        shutil.copy(repo_root() / f"config/schemas/{schema}.schema.yaml", root / "config/schemas/")
    path = root / "config" / "enterpriseops_gym.yaml"
    text = (repo_root() / "config/enterpriseops_gym.yaml").read_text()
    assert edit[0] in text
    path.write_text(text)
    assert load_paper_config("enterpriseops_gym", "paper", root)["source"]["kind"] == "official"
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("enterpriseops_gym", "paper", root)


def test_paper_scale_dry_run_puts_a_gpu_on_the_served_models_run_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[enterpriseops_gym]")
    counts = dict(re.findall(r"^(enterpriseops_gym_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts == {
        "enterpriseops_gym_download": "1",
        "enterpriseops_gym_download_dbs": "1",
        "enterpriseops_gym_download_model": "1",
        "enterpriseops_gym_preprocess": "1",
        "enterpriseops_gym_run_agents": "1",
        "enterpriseops_gym_evaluate": "1",
        "enterpriseops_gym_report": "1",
    }
    gpus = {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
    assert gpus["enterpriseops_gym_run_agents"] == {1}
    assert all(v == {0} for r, v in gpus.items() if r != "enterpriseops_gym_run_agents")


# ---- the domain servers under Apptainer (paper scale, unattended) ----------------------------------------------------

FAKE_APPTAINER = """#!{python}
# a stand-in for `apptainer run [opts] docker://image@digest`: records its argv, then serves HTTP on loopback at the
# port given by --env PORT=... (or exits 3 at once when --env FAIL=1), as a domain server would
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_APPTAINER_RECORD"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
env = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--env")
if env.get("FAIL"):
    print("fake server: cannot start", flush=True)
    sys.exit(3)
os.execv(sys.executable, [sys.executable, "-m", "http.server", env["PORT"], "--bind", "127.0.0.1"])
"""

DIGEST = "sha256:" + "ab" * 32


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_apptainer(tmp_path, monkeypatch):
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "apptainer"
    exe.write_text(FAKE_APPTAINER.format(python=sys.executable))
    exe.chmod(0o755)
    record = tmp_path / "apptainer_calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APPTAINER_RECORD", str(record))

    def calls():
        return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []

    return calls


def two_servers(**extra):
    ports = {"gym-itsm-mcp": free_port(), "gym-teams-mcp": free_port()}
    urls = {s: f"http://127.0.0.1:{p}" for s, p in ports.items()}
    images = {
        s: {"image": f"example/eog-{s}", "digest": DIGEST, "env": {"PORT": str(p), **extra.get(s, {})}}
        for s, p in ports.items()
    }
    return urls, {"start": True, "startup_timeout_s": 30, "stop_timeout_s": 5, "images": images}


def test_domain_servers_start_pinned_answer_log_and_stop(fake_apptainer, tmp_path):
    from paperflow.enterpriseops_gym import containers

    urls, boxes = two_servers()
    logs = tmp_path / "logs" / "run_agents" / "m_servers"
    with containers.domain_servers(boxes, urls, ["gym-teams-mcp", "gym-itsm-mcp", "gym-itsm-mcp"], logs) as cmds:
        assert all(containers.answers(u) for u in urls.values())
        assert sorted(cmds) == sorted(urls)
    calls = fake_apptainer()
    assert len(calls) == 2  # one start per server, however many tasks name it
    for call in calls:
        assert call[:3] == ["run", "--cleanenv", "--writable-tmpfs"]
        assert re.fullmatch(r"docker://example/eog-gym-(itsm|teams)-mcp@sha256:(ab){32}", call[-1])
    assert not any(containers.answers(u, timeout_s=1) for u in urls.values())  # stopped with the block
    for server in urls:  # each server's output in the job's log folder (http.server logs the health check's GET)
        assert "GET / " in (logs / f"{server}.log").read_text()


def test_domain_servers_stop_when_the_job_fails(fake_apptainer, tmp_path):
    from paperflow.enterpriseops_gym import containers

    urls, boxes = two_servers()
    with pytest.raises(RuntimeError, match="the agent crashed"):
        with containers.domain_servers(boxes, urls, list(urls), tmp_path / "logs"):
            raise RuntimeError("the agent crashed")
    assert not any(containers.answers(u, timeout_s=1) for u in urls.values())


def test_a_server_that_dies_at_start_fails_the_job_with_its_log_and_the_others_stop(fake_apptainer, tmp_path):
    from paperflow.enterpriseops_gym import containers

    urls, boxes = two_servers(**{"gym-teams-mcp": {"FAIL": "1"}})
    with pytest.raises(containers.ServerStartError, match=r"gym-teams-mcp exited with 3(.|\n)*cannot start"):
        with containers.domain_servers(boxes, urls, list(urls), tmp_path / "logs"):
            pytest.fail("the block must not run")
    assert not containers.answers(urls["gym-itsm-mcp"], timeout_s=1)


def test_an_unpinned_image_is_refused_naming_its_key_before_anything_starts(fake_apptainer, tmp_path):
    from paperflow.enterpriseops_gym import containers

    urls, boxes = two_servers()
    boxes["images"]["gym-teams-mcp"]["digest"] = None
    with pytest.raises(ConfigError, match=r"official\.containers\.images\.gym-teams-mcp\.digest is null"):
        with containers.domain_servers(boxes, urls, list(urls), tmp_path / "logs"):
            pytest.fail("the block must not run")
    assert fake_apptainer() == []
    # the train job refuses it too, before the model server starts
    cfg = load_paper_config("enterpriseops_gym", "paper")
    off = dict(cfg["official"], servers=urls, containers=boxes)
    path = tmp_path / "t.jsonl"
    official.write_jsonl(path, [{"gym_servers_config": [{"mcp_server_name": "gym-teams-mcp"}]}])
    with pytest.raises(ConfigError, match=r"official\.containers\.images\.gym-teams-mcp\.digest"):
        official.run_model("qwen3_4b", off["models"]["qwen3_4b"], {m: str(path) for m in off["modes"]}, off)
    assert fake_apptainer() == []


def test_user_started_servers_are_health_checked_only(fake_apptainer, tmp_path):
    from paperflow.enterpriseops_gym import containers

    urls, boxes = two_servers()
    boxes = dict(boxes, start=False, startup_timeout_s=0.5)
    with pytest.raises(containers.ServerStartError, match="did not answer"):
        with containers.domain_servers(boxes, urls, list(urls), tmp_path / "logs"):
            pytest.fail("the block must not run")
    assert fake_apptainer() == []


def test_paper_scale_dag_runs_the_domain_servers_under_apptainer_by_digest(dry_repo):
    """A real Snakemake dry run of the paper-scale DAG (the API's dryrun executor): the train job's params hold the
    apptainer command per domain server with the digest-pinned image, or the refusal of an unpinned one, and its log
    folder for the servers."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.types import ConfigSettings, DAGSettings, OutputSettings, ResourceSettings

    cfg = load_paper_config("enterpriseops_gym", "paper")["official"]["containers"]["images"]
    with SnakemakeApi(OutputSettings()) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=1),
            config_settings=ConfigSettings(config={"scale": "paper", "papers": ["enterpriseops_gym"]}),
            snakefile=dry_repo / "Snakefile",
            workdir=dry_repo,
        )
        dag = wf.dag(DAGSettings(forceall=True))
        dag.execute_workflow(executor="dryrun")
        jobs = [j for j in dag.workflow_api._workflow.dag.jobs if j.rule.name == "enterpriseops_gym_run_agents"]
    assert len(jobs) == 1
    shown = jobs[0].params.domain_servers
    assert sorted(shown) == sorted(cfg)
    for server, spec in cfg.items():
        if spec["digest"]:
            assert shown[server] == (
                f"apptainer run --cleanenv --writable-tmpfs docker://{spec['image']}@{spec['digest']}"
            )
        else:
            assert shown[server].startswith(f"refused: official.containers.images.{server}.digest is null")
    assert any(spec["digest"] for spec in cfg.values())
    assert jobs[0].params.servers_log_dir == "results/paper/enterpriseops_gym/logs/run_agents/qwen3_4b_servers"


def test_episodes_are_journalled_and_a_rerun_runs_only_the_missing_ones(world, served, tmp_path):
    """Each finished episode goes to the job's journal; a rerun with part of it (a kill) runs only the other
    episodes and returns every episode's record, in the order an uninterrupted run gives (issue 43)."""
    _, picked, _ = world
    runnable = prepared(world, tmp_path, served.url)
    journal = tmp_path / "ckpt" / "episodes.jsonl"
    model = JudgedModel(endpoint.ScriptedModel(picked["oracle"], bad_step=0, http_errors=0), [])
    with endpoint.Endpoint(model) as url:
        agent = harness.ReactAgent(url, "scripted", max_iterations=50, retries=5, name="scripted")
        judge = official.LlmJudge(url, "scripted")
        whole = official.run_official(runnable, agent, judge, runs=2, journal=journal)
        lines = journal.read_text().splitlines(keepends=True)
        assert len(lines) == len(whole) == 2 * len(runnable)
        journal.write_text("".join(lines[:1]))  # killed after the first episode
        ran = []
        episode = official.run_official_episode
        official.run_official_episode = lambda *a, **k: ran.append(a[3]) or episode(*a, **k)
        try:
            resumed = official.run_official(runnable, agent, judge, runs=2, journal=journal)
        finally:
            official.run_official_episode = episode
    assert len(ran) == len(whole) - 1
    assert [(r["task_id"], r["run"]) for r in resumed] == [(r["task_id"], r["run"]) for r in whole]
    assert resumed[0] == whole[0] and all(r["overall_success"] for r in resumed)
