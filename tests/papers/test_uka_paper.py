"""uka at paper scale, offline: the OpenAI-compatible client and the vLLM server launcher against a scripted fake
HTTP server, ESConv records in PPDPP's layout, the pinned / unpinned downloads, the whole LLM path (ToM table,
acquisition, test dialogues, judge, report) on the fake, and the paper DAG's GPU requests. No network, no GPU."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_openai import FakeOpenAI, chat_choices

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.lm import serve
from paperflow.uka import dialogue as dl
from paperflow.uka import esconv, llm
from paperflow.uka import needworld as nw
from paperflow.uka import paper as pp

VERDICTS = {
    "worse": "No, the Seeker feels worse.",
    "same": "No, the Seeker feels the same.",
    "better": "No, but the Seeker feels better.",
    "solved": "Yes, the Seeker's issue has been solved.",
}


class Scripted:
    """The fake LLM: answers by role, recognised from the prompts of paperflow.uka.dialogue. The supporter echoes
    its strategy instruction; the critic calls a dialogue solved once the last supporter turn affirmed the seeker
    (and 'the same' otherwise), with one off-format sample; the feedback reader says 'agrees' after an affirmation
    and 'elaborates' otherwise; the ToM model's answer depends on the need for an affirmation only (so that it is
    the one strategy with a positive EIG); the judge always says A."""

    server: FakeOpenAI  # set by the fixture

    @property
    def bodies(self) -> list[dict]:
        return self.server.bodies

    def reply(self, body: dict) -> list[str]:
        msgs, n = body["messages"], body.get("n", 1)
        system = msgs[0]["content"] if msgs[0]["role"] == "system" else ""
        last = msgs[-1]["content"]
        if system == dl.CRITIC_SYSTEM:
            verdict = VERDICTS["solved"] if "Affirm" in last.rsplit("Supporter:", 1)[-1] else VERDICTS["same"]
            return ["I am not sure."] + [verdict] * (n - 1)
        if system.startswith("You are a supporter"):
            return [f"Supporter line. {system.rsplit('one short sentence.', 1)[-1].strip()}"] * n
        if system.startswith("You play a help-seeker"):
            return ["It is still hard for me."] * n
        if last.startswith("Conversation:"):
            return ["agrees" if "Affirm" in last else "Elaborates."] * n
        if "mainly wants" in last:  # only an affirmation's reply tells the needs apart
            need = next(i for i, z in enumerate(nw.NEEDS) if dl.NEED_DEFINITION[z] in last)
            if "'Affirmation and Reassurance'" in last:
                return [nw.FEEDBACK[need]] * n
            return [nw.FEEDBACK[3 + i % 2] for i in range(n)]
        if "Which supporter helped" in last:
            return ["A"] * n
        raise AssertionError(f"unscripted request: {last[:200]}")


@pytest.fixture
def fake_llm():
    script = Scripted()
    answer = lambda path, body: chat_choices(script.reply(body))  # noqa: E731
    with FakeOpenAI(answer, name=llm.SERVED_NAME) as server:
        script.server = server
        yield server.url, script


def esconv_record(emotion: str, problem: str, i: int) -> dict:
    """One dialogue in PPDPP's esc-*.txt layout (keys and speaker tags as in the pinned file)."""
    return {
        "emotion_type": emotion,
        "problem_type": problem,
        "situation": f"Situation {i}: things have been hard lately.",
        "dialog": [
            {"text": "Hi there, what's going on today?", "speaker": "sys", "strategy": "Question"},
            {"text": f"I feel {emotion} because of {problem} ({i}).", "speaker": "usr"},
            {"text": "That sounds hard.", "speaker": "sys", "strategy": "Reflection of feelings"},
        ],
    }


def paper_cfg(base_url: str | None = None) -> dict:
    cfg = load_paper_config("uka", "paper")
    cfg["simulation"] = {"turns": 3, "critic_samples": 3}
    cfg["training"] = {"dialogues": 3, "budget_turns": 12, "max_revisions": 1}
    cfg["server"] = {
        **cfg["server"],
        "base_url": base_url,
        "ready_timeout_s": 10,
        "timeout_s": 10,
        "retries": 2,
        "concurrency": 4,
    }
    cfg["tom"] = {"samples": 2}
    return cfg


def test_the_paper_config_pins_the_test_split_and_the_backbone():
    cfg = load_paper_config("uka", "paper")
    assert cfg["source"]["kind"] == "esconv"
    assert re.fullmatch(r"[0-9a-f]{64}", cfg["data"]["test"]["sha256"])
    assert "/f44dccdd43f335e5e5f372ab556cfd9f182f9c55/" in cfg["data"]["test"]["url"]
    assert re.fullmatch(r"[0-9a-f]{40}", cfg["pretrained"]["revision"])
    assert cfg["pretrained"]["device"] == "cuda" and cfg["resources"]["gpus"] >= 1
    # issue 46: the judge is another model, pinned the same way; the permuted-ToM control runs at paper scale too
    assert cfg["judge"]["hub"] != cfg["pretrained"]["hub"] and re.fullmatch(r"[0-9a-f]{40}", cfg["judge"]["revision"])
    assert "uka_permuted_tom" in cfg["methods"]


def test_the_judge_is_served_and_asked_as_its_own_model(tmp_path):
    cfg = paper_cfg()
    with FakeOpenAI(lambda path, body: chat_choices(["B"]), name=llm.JUDGE_NAME) as server:
        cfg["server"] = {**cfg["server"], "base_url": "http://127.0.0.1:9/v1", "judge_base_url": server.url}
        with pp.judge(str(tmp_path / "unused.json"), cfg, str(tmp_path / "judge.log")) as client:
            roles = dl.Roles(client, cfg["llm"])
            assert roles.judge({"emotion": "anxiety", "problem": "job crisis"}, [], [], seed=1) == "B"
        assert [b["model"] for b in server.bodies] == [llm.JUDGE_NAME]
    cmd = llm.vllm_command("/snap/llama", cfg["server"], gpus=1, dtype="bfloat16", name=llm.JUDGE_NAME)
    assert cmd[cmd.index("--served-model-name") + 1] == llm.JUDGE_NAME


def test_a_judge_that_is_the_backbone_is_refused(repo_copy):
    path = repo_copy / "config" / "uka.yaml"
    text = path.read_text()
    assert "    hub: meta-llama/Llama-3.1-8B-Instruct" in text
    path.write_text(text.replace("    hub: meta-llama/Llama-3.1-8B-Instruct", "    hub: Qwen/Qwen2.5-7B-Instruct"))
    with pytest.raises(ConfigError, match="judge.hub"):
        load_paper_config("uka", "paper", repo_copy)


def test_the_chat_request_body_is_ukas_and_the_texts_come_back_in_choice_order(fake_llm):
    url, script = fake_llm
    client = llm.client_for(url, {"timeout_s": 5, "retries": 0})
    message = {"role": "user", "content": "Which supporter helped more?", "name": "dropped"}
    assert llm.chat_texts(client, [message], temperature=0, max_tokens=2, n=2, seed=5) == ["A", "A"]
    assert script.bodies[-1] == {
        "model": llm.SERVED_NAME,
        "messages": [{"role": "user", "content": "Which supporter helped more?"}],
        "temperature": 0.0,
        "max_tokens": 2,
        "n": 2,
        "seed": 5,
    }
    llm.chat_texts(client, [message], temperature=0.7, max_tokens=2)
    assert script.bodies[-1]["n"] == 1 and "seed" not in script.bodies[-1]


def test_the_critic_over_http_keeps_the_keyword_map_and_drops_off_format_samples(fake_llm):
    url, _ = fake_llm
    roles = dl.Roles(llm.client_for(url, {"timeout_s": 5, "retries": 0}), load_paper_config("uka", "paper")["llm"])
    case = {"emotion": "anxiety", "problem": "job crisis"}
    solved = [{"role": "seeker", "content": "hi"}, {"role": "supporter", "content": "Affirm: you did well."}]
    texts, reward = roles.critic(case, solved, 4, seed=1)
    assert texts[0] == "I am not sure." and reward == pytest.approx(1.0)  # 3 x solved, the off-format one dropped
    same = [{"role": "seeker", "content": "hi"}, {"role": "supporter", "content": "Tell me more."}]
    assert roles.critic(case, same, 4, seed=1)[1] == pytest.approx(-0.5)


def test_the_vllm_command_line_serves_the_snapshot_under_one_name():
    server = load_paper_config("uka", "paper")["server"]
    cmd = llm.vllm_command("/snap/qwen", server, gpus=2, dtype="bfloat16")
    assert cmd[:3] == ["vllm", "serve", "/snap/qwen"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags == {
        "--served-model-name": llm.SERVED_NAME,
        "--host": "127.0.0.1",
        "--port": str(server["port"]),
        "--dtype": "bfloat16",
        "--max-model-len": str(server["max_model_len"]),
        "--gpu-memory-utilization": str(float(server["gpu_memory_utilization"])),
        "--tensor-parallel-size": "2",
        "--generation-config": "vllm",
    }


FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, doc):
        data = json.dumps(doc).encode(); self.send_response(200)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self): self._send({"data": []})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send({"choices": [{"index": 0, "message": {"content": "served"}}]})
print("fake server up", flush=True)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_served_starts_the_command_waits_for_it_and_stops_it(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    server = {"port": port, "ready_timeout_s": 30, "timeout_s": 5, "retries": 0, "base_url": None}
    with llm.served([sys.executable, str(script), str(port)], server, tmp_path / "server.log") as client:
        assert llm.chat_texts(client, [{"role": "user", "content": "x"}], temperature=0, max_tokens=1) == ["served"]
    assert "fake server up" in (tmp_path / "server.log").read_text()
    with pytest.raises(serve.ServerError, match="exited with status 3"):
        with llm.served([sys.executable, "-c", "import sys; sys.exit(3)"], server, tmp_path / "dead.log"):
            pass


def test_an_llm_job_without_a_gpu_fails_naming_the_device_key(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    (tmp_path / "pretrained.json").write_text(json.dumps({"folder": str(tmp_path)}))
    with pytest.raises(ConfigError, match="pretrained.device"):
        with pp.backbone(str(tmp_path / "pretrained.json"), paper_cfg(), str(tmp_path / "server.log")):
            pass


def test_only_pinned_files_are_fetched_and_an_unpinned_one_is_refused(tmp_path, serve_bytes):
    payload = (json.dumps(esconv_record("anxiety", "job crisis", 0)) + "\n").encode()
    base, hits = serve_bytes(payload)
    data = {
        "train": {"url": f"{base}/esc-train.txt", "sha256": hashlib.sha256(payload).hexdigest()},
        "test": {"url": f"{base}/esc-test.txt", "sha256": hashlib.sha256(payload).hexdigest()},
    }
    outs = {s: str(tmp_path / f"{s}.jsonl") for s in pp.SPLITS}
    assert pp.download_data(data, outs) == {"train": 1, "test": 1}
    assert sorted(hits) == ["/esc-test.txt", "/esc-train.txt"]
    data["train"]["sha256"] = None
    Path(outs["train"]).unlink()
    with pytest.raises(UnpinnedDownload, match="paperflow pin uka") as err:
        pp.download_data(data, outs)
    assert "data.train.sha256" in str(err.value)
    assert not Path(outs["train"]).exists()


def test_the_backbone_download_uses_the_pinned_commit_and_files(tmp_path, monkeypatch):
    import paperflow.core.lm.models as models

    calls = []
    monkeypatch.setattr(models, "download_pretrained", lambda *a, **k: calls.append((a, k)) or Path(a[2]))
    pretrained = load_paper_config("uka", "paper")["pretrained"]
    doc = download_model(
        pretrained,
        slug="uka",
        key="pretrained.revision",
        cache=str(tmp_path / "cache"),
        out=str(tmp_path / "pretrained.json"),
    )
    (hub, revision, folder), kw = calls[0]
    assert (hub, revision) == (pretrained["hub"], pretrained["revision"]) == (doc["hub"], doc["revision"])
    assert kw["allow_patterns"] == pretrained["files"] and folder == Path(doc["folder"])
    with pytest.raises(UnpinnedDownload, match="paperflow pin uka"):
        download_model(
            {**pretrained, "hub": "someone/unpinned-model", "revision": None},
            slug="uka",
            key="pretrained.revision",
            cache=str(tmp_path),
            out="x.json",
        )


def test_esconv_records_become_cases_and_a_record_without_a_seeker_is_refused(tmp_path):
    path = tmp_path / "esc.txt"
    path.write_text(
        "\n".join(
            json.dumps(esconv_record(e, p, i))
            for i, (e, p) in enumerate([("Anxiety", "job crisis"), ("sadness", "Breakup with partner")])
        )
    )
    cases = esconv.read_cases(path, "test")
    assert list(cases["emotion"]) == ["anxiety", "sadness"] and cases["problem"][1] == "breakup with partner"
    assert cases["first_user"][0].startswith("I feel Anxiety") and cases["strategies"][0] == [
        "Question",
        "Reflection of feelings",
    ]
    bad = esconv_record("anger", "x", 9)
    bad["dialog"] = [t for t in bad["dialog"] if t["speaker"] == "sys"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="without a seeker"):
        esconv.read_cases(path, "test")


def test_the_paper_path_runs_end_to_end_on_the_fake_llm(tmp_path, fake_llm):
    from paperflow.core.report import publish
    from paperflow.uka.paper_report import build_report

    url, script = fake_llm
    cfg = paper_cfg(url)
    raw = {}
    pairs = [("anxiety", "job crisis"), ("sadness", "breakup with partner"), ("anger", "job crisis")]
    for split in pp.SPLITS:
        raw[split] = tmp_path / f"{split}.jsonl"
        raw[split].write_text("\n".join(json.dumps(esconv_record(e, p, i)) for i, (e, p) in enumerate(pairs)) + "\n")
    cases, emb = str(tmp_path / "cases.parquet"), str(tmp_path / "emb.parquet")
    pp.preprocess(raw, {"kind": "hashed", "batch_size": 8}, cases, emb)
    tom_json = str(tmp_path / "tom.json")
    with pp.backbone(str(tmp_path / "unused.json"), cfg, str(tmp_path / "server.log")) as client:
        doc = pp.tom(client, cfg, tom_json)
        table = np.asarray(doc["likelihood"])
        assert table.shape == (4, 8, 5) and np.allclose(table.sum(-1), 1)
        assert doc["unparsed"] == 0 and np.argmax(dl.bf.eig(dl.bf.uniform(1, 4), table)[0]) == nw.AR
        mem_paths, all_attempts = {}, []
        for method in ("principles", "uka"):
            memory, attempts = pp.train(client, method, cases, emb, tom_json, cfg, [0])
            assert len(attempts) <= cfg["training"]["budget_turns"]
            all_attempts.append(attempts)
            if method == "principles":  # one principle per winning attempt
                assert len(memory) == attempts["won"].sum()
            else:  # UKA asks the informative strategy first, wins with it and writes it down
                assert attempts["strategy"].iloc[0] == nw.AR and attempts["won"].iloc[0]
                assert set(memory[memory["reward"] > 0]["strategy"]) == {nw.AR}
            mem_paths[method] = str(tmp_path / f"{method}.parquet")
            from paperflow.core.io import write_frame

            write_frame(mem_paths[method], memory)
        per_case, trans = [], {}
        for method in ("standard", "principles", "uka", "uka_permuted_tom"):
            memory = mem_paths.get("uka" if method == "uka_permuted_tom" else method)
            pc, pt, tr = pp.evaluate(client, method, cases, emb, tom_json, memory, cfg, [0])
            assert len(pc) == len(pairs) and set(pt["turn"]) <= {0, 1, 2}
            assert all(t["history"][0]["role"] == "seeker" for t in tr)
            per_case.append(pc)
            trans[method] = str(tmp_path / f"{method}.jsonl")
            pp.write_transcripts(trans[method], tr)
        wins = pp.win_rate(client, "uka", "principles", trans["uka"], trans["principles"], cases, cfg, [0])
    per_case = pd.concat(per_case, ignore_index=True)
    # the scripted judge always answers A: each order votes once for each side, so every case is a split (0.5)
    assert list(wins["win"]) == [0.5] * len(pairs)
    # UKA's memory holds the solving strategy (affirmation); Standard never gets a strategy instruction
    sr = per_case.groupby("method")["success"].mean()
    assert sr["uka"] == 1.0 and sr["standard"] == 0.0
    assert per_case[per_case["method"] == "standard"]["entropy_t3"].isna().all()
    strategies = {
        b["messages"][0]["content"] for b in script.bodies if b["messages"][0]["content"].startswith("You are")
    }
    assert any(s.endswith("one short sentence.") for s in strategies)  # Standard's prompt: no instruction
    seeker = [b["messages"] for b in script.bodies if b["messages"][0]["content"].startswith("You play a help-seeker")]
    assert all(m[1]["role"] == "user" and [x["role"] for x in m[2:4]] == ["assistant", "user"] for m in seeker)
    params = {**cfg, "seeds": [0], "scale": "paper"}
    report = build_report(per_case, wins, params, pd.concat(all_attempts, ignore_index=True))
    outputs = {
        k: str(tmp_path / "out" / f)
        for k, f in (
            ("report", "report.md"),
            ("metrics", "metrics.json"),
            ("metrics_table", "metrics.parquet"),
            ("table_methods", "methods.csv"),
            ("figure_success", "success.png"),
        )
    }
    doc = publish(report, outputs, paper="uka", scale="paper", claims=cfg["claims"])
    claims = {c["id"]: c for c in doc["claims"]}
    assert set(claims) == {
        "paper_sr_uka_minus_principles",
        "paper_sr_principles_minus_standard",
        "paper_win_rate_uka_vs_principles",
    }
    assert claims["paper_sr_uka_minus_principles"]["value"] == pytest.approx(sr["uka"] - sr["principles"])
    assert claims["paper_sr_uka_minus_principles"]["n_units"] == len(pairs)
    assert claims["paper_win_rate_uka_vs_principles"]["held"] is False  # 0.5 is not above 0.5
    text = Path(outputs["report"]).read_text()
    assert "Self-play knowledge acquisition" in text and "| UKA |" in text


def test_the_paper_dag_puts_gpus_on_the_llm_rules_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[uka]")
    cfg = load_paper_config("uka", "paper")
    gpus = {}
    for job in parse_dry_run(proc.stdout):
        if job.rule.startswith("uka_"):
            gpus.setdefault(job.rule, set()).add(job.gpus)
    llm_rules = {"uka_tom", "uka_train", "uka_evaluate", "uka_win_rate"}
    assert set(gpus) == llm_rules | {
        "uka_download",
        "uka_download_model",
        "uka_download_judge",
        "uka_preprocess",
        "uka_report",
    }
    assert all(gpus[r] == {cfg["resources"]["gpus"]} for r in llm_rules)
    assert all(v == {0} for r, v in gpus.items() if r not in llm_rules)
    counts = dict(re.findall(r"^(uka_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts["uka_evaluate"] == str(len(cfg["methods"]))
    assert counts["uka_win_rate"] == str(len(cfg["methods"]) - 1)


def test_a_paper_config_without_its_llm_keys_names_them(repo_copy):
    path = repo_copy / "config" / "uka.yaml"
    text = path.read_text()
    assert "  win_rate: {reference: principles}" in text
    path.write_text(text.replace("  win_rate: {reference: principles}", "  win_rate: {reference: uka_no_eig_train}"))
    with pytest.raises(ConfigError, match="win_rate.reference"):
        load_paper_config("uka", "paper", repo_copy)


class Cut:
    """The job's client, cut off after `limit` requests (a job killed part way); counts the requests it passed."""

    def __init__(self, client, limit: int | None = None):
        import threading

        self.client, self.limit, self.calls, self.lock = client, limit, 0, threading.Lock()

    def chat(self, *args, **kwargs):
        with self.lock:
            if self.limit is not None and self.calls >= self.limit:
                raise RuntimeError("killed")
            self.calls += 1
        return self.client.chat(*args, **kwargs)


@pytest.fixture
def llm_inputs(tmp_path, fake_llm):
    """The cases, embeddings, ToM table, memory and transcripts of the LLM stages, made on the fake LLM."""
    url, _ = fake_llm
    cfg = paper_cfg(url)
    cfg["server"]["concurrency"] = 2
    pairs = [("anxiety", "job crisis"), ("sadness", "breakup with partner"), ("anger", "job crisis")]
    raw = {}
    for split in pp.SPLITS:
        raw[split] = tmp_path / f"{split}.jsonl"
        raw[split].write_text("\n".join(json.dumps(esconv_record(e, p, i)) for i, (e, p) in enumerate(pairs)) + "\n")
    files = {"cases": str(tmp_path / "cases.parquet"), "emb": str(tmp_path / "emb.parquet")}
    pp.preprocess(raw, {"kind": "hashed", "batch_size": 8}, files["cases"], files["emb"])
    files["tom"] = str(tmp_path / "tom.json")
    with pp.backbone(str(tmp_path / "unused.json"), cfg, str(tmp_path / "server.log")) as client:
        from paperflow.core.io import write_frame

        pp.tom(client, cfg, files["tom"])
        files["memory"] = str(tmp_path / "memory.parquet")
        write_frame(
            files["memory"], pp.train(client, "uka", files["cases"], files["emb"], files["tom"], cfg, [0, 1])[0]
        )
        for method, memory in (("uka", files["memory"]), ("standard", None)):
            tr = pp.evaluate(client, method, files["cases"], files["emb"], files["tom"], memory, cfg, [0, 1])[2]
            files[method] = str(tmp_path / f"{method}.jsonl")
            pp.write_transcripts(files[method], tr)
        yield client, cfg, files


STAGES = {  # stage -> (its run on a client with a journal, the requests of one journalled unit)
    "train": (lambda c, cfg, f, j: pp.train(c, "uka", f["cases"], f["emb"], f["tom"], cfg, [0, 1], j), 4),
    "evaluate": (
        lambda c, cfg, f, j: pp.evaluate(c, "uka", f["cases"], f["emb"], f["tom"], f["memory"], cfg, [0, 1], j),
        4,
    ),
    "win_rate": (
        lambda c, cfg, f, j: (pp.win_rate(c, "uka", "standard", f["uka"], f["standard"], f["cases"], cfg, [0, 1], j),),
        2,
    ),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_killed_llm_stage_resumes_from_its_journal_and_asks_only_the_rest(tmp_path, llm_inputs, stage):
    client, cfg, files = llm_inputs
    run, per_unit = STAGES[stage]
    whole = Cut(client)
    expected = run(whole, cfg, files, None)  # uninterrupted, outside a job (a scratch journal)
    journal = tmp_path / "checkpoints" / "rows.jsonl"
    cut = whole.calls // 2 + 1
    with pytest.raises(RuntimeError, match="killed"):
        run(Cut(client, cut), cfg, files, journal)
    kept = len(journal.read_text().splitlines())
    assert 0 < kept * per_unit <= cut  # the finished units were kept as they came
    rerun = Cut(client)
    got = run(rerun, cfg, files, journal)
    assert rerun.calls == whole.calls - kept * per_unit  # only the units the killed run had not finished
    for a, b in zip(got, expected, strict=True):
        if isinstance(a, pd.DataFrame):
            pd.testing.assert_frame_equal(a, b)
        else:
            assert a == b
    assert len(journal.read_text().splitlines()) * per_unit == whole.calls
