"""promptscale at paper scale, offline: Hub files in the real layouts and columns (PromptCoT 1.0's prompt/completion
parquet, math-ai/aime24's parquet, math-ai/aime25's test.jsonl, MathArena's parquet) laid out as snapshot_download
lays them out, only the configured files fetched at the pinned commit, an unpinned one refused naming `paperflow pin
promptscale`; the vLLM client and the server launch against a local fake OpenAI-compatible server; TRL's token
layout; the whole EM -> synthesis -> benchmark -> report path on a tiny Qwen2 with a small BPE tokenizer on the CPU;
config errors by name; the paper-scale DAG with GPUs on the heavy rules only."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from fake_hub import FakeHub, install
from fake_openai import FakeOpenAI, chat_choices

from paperflow.core import sandbox
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.lm import serve
from paperflow.promptscale import llm_text as lt
from paperflow.promptscale import paper, paper_generate, sft, vllm_server

SHA = "0123456789abcdef0123456789abcdef01234567"
CONCEPTS = ["modular arithmetic", "prime numbers", "counting subsets", "geometric series", "angle bisectors"]


def seed_rows(n=24) -> pd.DataFrame:
    """PromptCoT 1.0's columns: prompt (numbered concepts, difficulty level) and completion (marked spans)."""
    rows = []
    for i in range(n):
        cs = [CONCEPTS[i % 5], CONCEPTS[(i + 2) % 5]]
        prompt = (
            "Given foundational concepts and difficulty level, identify connections and develop a question.\n\n"
            f"Foundational Concepts:\n1. {cs[0]}\n2. {cs[1]}\n\nDifficulty Level: AMC12"
        )
        completion = (
            f"{lt.RATIONALE[0]}\nCombine {cs[0]} with {cs[1]} using the number {i}.\n{lt.RATIONALE[1]}\n\n"
            f"{lt.PROBLEM[0]}\nFind the remainder of {i} squared by seven.\n{lt.PROBLEM[1]}"
        )
        rows.append({"prompt": prompt, "completion": completion})
    rows.append({"prompt": "no concepts here", "completion": "nothing marked"})  # dropped by the parser
    return pd.DataFrame(rows)


def lcb_record(qid, date, public, private, starter="", fn_name=None, compress=True):
    """A row of livecodebench/code_generation_lite: tests as JSON text, the private ones base64(zlib(pickle(text)))
    as the dataset stores the large ones."""
    import base64
    import pickle
    import zlib

    private_text = json.dumps(private)
    return {
        "question_title": qid,
        "question_content": f"Problem {qid}: add the two numbers.",
        "platform": "leetcode" if fn_name else "atcoder",
        "question_id": qid,
        "contest_id": qid.split("_")[0],
        "contest_date": f"{date}T00:00:00",
        "starter_code": starter,
        "difficulty": "easy",
        "public_test_cases": json.dumps(public),
        "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(private_text))).decode()
        if compress
        else private_text,
        "metadata": json.dumps({"func_name": fn_name} if fn_name else {}),
    }


def stdin_test(a, b):
    return {"input": f"{a} {b}\n", "output": f"{a + b}\n", "testtype": "stdin"}


def fn_test(a, b):
    return {"input": f"{a}\n{b}", "output": json.dumps(a + b), "testtype": "functional"}


LCB_FILES = {
    "test4.jsonl": [lcb_record("abc370_a", "2024-07-30", [stdin_test(1, 2)], [stdin_test(3, 4)])],  # before v5
    "test5.jsonl": [
        lcb_record("abc380_a", "2024-11-16", [stdin_test(1, 2)], [stdin_test(5, 6), stdin_test(-1, 1)]),
        lcb_record(
            "weekly_1",
            "2025-01-05",
            [fn_test(1, 2)],
            [fn_test(7, 8)],
            "class Solution:\n    def add(self, a: int, b: int) -> int:\n        ",
            "add",
            compress=False,
        ),
    ],
    "test6.jsonl": [lcb_record("abc395_a", "2025-03-01", [stdin_test(2, 2)], [stdin_test(9, 9)])],
}


SFT_ROWS = pd.DataFrame(
    {
        "prompt": [f"<|im_start|>user\nFind {i} plus {i}.<|im_end|>\n<|im_start|>assistant" for i in range(6)],
        "completion": [f"\nthink</think> \\boxed{{{2 * i}}}" for i in range(5)] + ["  "],  # the last one empty
    }
)


def codeforces_rows() -> pd.DataFrame:
    """open-r1/codeforces's statement columns (its dataset card's features): two usable problems, one interactive,
    one without a description, a repeated id (the code seeds' statements: test_promptscale_code_seeds.py)."""
    base = {
        "contest_id": "1",
        "input_format": "Two integers a and b.",
        "output_format": "Their sum.",
        "interaction_format": None,
        "note": None,
        "rating": 800.0,
        "tags": ["math"],
        "examples": [{"input": "1 2\n", "output": "3\n"}],
        "official_tests": [{"input": "5 5\n", "output": "10\n"}],
    }
    rows = [
        {**base, "id": "1/A", "index": "A", "title": "A. Sum", "description": "Add two numbers.", "note": "1+2=3."},
        {
            **base,
            "id": "1/B",
            "index": "B",
            "title": "B. Guess",
            "description": "Guess x.",
            "interaction_format": "Ask ? y.",
        },
        {**base, "id": "1/C", "index": "C", "title": "C. Empty", "description": ""},
        {
            **base,
            "id": "1/D",
            "index": "D",
            "title": "D. Max",
            "description": "Print the larger one.",
            "rating": None,
            "tags": ["greedy", "implementation"],
            "examples": [],
        },
        {**base, "id": "1/A", "index": "A", "title": "A. Sum", "description": "Add two numbers."},
    ]
    return pd.DataFrame(rows)


def codeelo_records() -> list[dict]:
    """Qwen/CodeElo's test.json columns (its dataset card; public loaders): examples as [input, output] pairs,
    interaction empty unless interactive (the Codeforces Elo: test_promptscale_codeforces.py)."""
    base = {
        "rating": 800,
        "tags": ["math"],
        "div": "Div. 2",
        "time_limit_ms": 1000,
        "memory_limit_mb": 256,
        "input": "Two integers a and b.",
        "output": "Their sum.",
        "interaction": "",
        "note": "",
    }
    return [
        {
            **base,
            "problem_id": "2001B",
            "url": "https://codeforces.com/contest/2001/problem/B",
            "title": "Guess",
            "description": "Guess x.",
            "interaction": "Ask ? y.",
            "examples": [],
            "rating": None,
        },
        {
            **base,
            "problem_id": "2000A",
            "url": "https://codeforces.com/contest/2000/problem/A",
            "title": "Sum",
            "description": "Add two numbers.",
            "examples": [["1 2\n", "3\n"]],
            "note": "1+2=3.",
        },
    ]


HUB_FILES = {
    "Qwen/CodeElo": {"test.json": codeelo_records(), "README.md": []},  # README.md is not configured: never fetched
    "open-r1/codeforces": {
        "data/train-00000-of-00001.parquet": codeforces_rows(),
        "data/test-00000-of-00001.parquet": codeforces_rows().iloc[:1],  # not configured: never fetched
    },
    "livecodebench/code_generation_lite": LCB_FILES,
    "xl-zhao/PromptCoT-2.0-SFT-4.8M": {
        "data/train-00000-of-00002.parquet": SFT_ROWS.iloc[:3],
        "data/train-00001-of-00002.parquet": SFT_ROWS.iloc[3:],
    },
    "xl-zhao/PromptCoT-Problem-Generation-Dataset": {"data/train-00000-of-00001.parquet": seed_rows()},
    "math-ai/aime24": {
        "test-00000-of-00001.parquet": pd.DataFrame(
            {
                "id": [60, 61],
                "problem": ["Find 3 times 11.", "Find 2 to the fifth."],
                "solution": ["So it is $\\boxed{033}$.", "We get \\boxed{\\text{32}}"],
                "url": ["u0", "u1"],
            }
        )
    },
    "math-ai/aime25": {"test.jsonl": [{"id": "0", "problem": "Find 7 plus 8.", "answer": "15"}]},
    "MathArena/hmmt_feb_2025": {
        "data/train-00000-of-00001.parquet": pd.DataFrame(
            {"problem_idx": [1], "problem": ["Find 6 times 7."], "answer": ["42"]}
        )
    },
}


# a Qwen3-thinking-like template: the generation prompt opens the reasoning, the model closes it with </think>
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


def bpe_tokenizer():
    """A small byte-level BPE (the Qwen tokenizers' kind) trained on the texts of the fixtures."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [r["prompt"] + r["completion"] for r in seed_rows().to_dict("records")]
    texts += [lt.p_prompt(CONCEPTS, "AMC12"), lt.q_prompt(CONCEPTS, "AMC12", "x"), lt.p_completion("z", "x")]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@pytest.fixture(scope="module")
def tiny_model_folder(tmp_path_factory):
    """A tiny Qwen2 and its tokenizer saved as a Hub snapshot folder."""
    from paperflow.core.lm.models import build_model, save_model

    folder = tmp_path_factory.mktemp("qwen")
    tok = bpe_tokenizer()
    spec = {
        "arch": "qwen2",
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
    }
    save_model(build_model(spec, seed=0), folder)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def hub(monkeypatch, tiny_model_folder):
    """download_pretrained replaced by a fake Hub; returns the calls (repo, revision, patterns, written files)."""
    return install(monkeypatch, FakeHub(HUB_FILES, model=tiny_model_folder)).calls


@pytest.fixture(scope="module")
def cfg():
    return load_paper_config("promptscale", "paper")


def pinned(spec):
    return {**spec, "revision": spec["revision"] or SHA}


def test_downloads_fetch_only_the_configured_files_at_the_pinned_commit_and_normalise_rows(hub, cfg, tmp_path):
    out = {}
    for name, spec in cfg["corpora"].items():
        spec = {k: v for k, v in spec.items() if k != "sha256"}  # the fake files are not the real ones
        info = paper.download_corpus(name, pinned(spec), str(tmp_path / "cache"), str(tmp_path / f"{name}.jsonl"))
        out[name] = lt.read_jsonl(tmp_path / f"{name}.jsonl")
        assert info["revision"] == (spec["revision"] or SHA)
    assert [c["patterns"] for c in hub] == [list(s["files"]) for s in cfg["corpora"].values()]
    assert all(c["written"] for c in hub)
    assert len(out["seeds"]) == 24  # the malformed row is dropped
    assert out["seeds"][0]["concepts"] == [CONCEPTS[0], CONCEPTS[2]] and out["seeds"][0]["difficulty"] == "AMC12"
    assert out["seeds"][3]["problem"] == "Find the remainder of 3 squared by seven."
    assert [r["answer"] for r in out["aime24"]] == ["033", "\\text{32}"]
    assert out["aime25"] == [{"id": "0", "problem": "Find 7 plus 8.", "answer": "15"}]
    assert out["hmmt_feb25"] == [{"id": "1", "problem": "Find 6 times 7.", "answer": "42"}]
    doc = download_model(
        cfg["models"]["prompt"],
        slug="promptscale",
        key="models.prompt.revision",
        cache=str(tmp_path / "cache"),
        out=str(tmp_path / "m.json"),
        extra={"role": "prompt"},
    )
    assert doc["revision"] == cfg["models"]["prompt"]["revision"]
    assert hub[-1]["patterns"] == list(cfg["models"]["prompt"]["files"])


def test_an_unpinned_corpus_is_refused_naming_paperflow_pin(hub, cfg, tmp_path):
    spec = cfg["corpora"]["hmmt_feb25"]
    assert spec["revision"] is None  # no published commit (config/unpinned.yaml)
    with pytest.raises(UnpinnedDownload, match=r"corpora\.hmmt_feb25\.revision.*paperflow pin promptscale"):
        paper.download_corpus("hmmt_feb25", spec, str(tmp_path), str(tmp_path / "x.jsonl"))
    assert hub == []


def test_boxed_answers_and_their_normalisation():
    assert lt.last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert lt.last_boxed("no answer") is None
    assert lt.answer_matches("thus \\boxed{033}", "33") and lt.answer_matches("\\boxed{ 15 }", "15")
    assert not lt.answer_matches("\\boxed{16}", "15") and not lt.answer_matches("15", "15")
    with pytest.raises(ValueError, match="row 0 has no problem or no answer"):
        lt.benchmark_rows([{"problem": "p", "solution": "no box"}], "problem_solution_boxed", "aime24")


class FakeVLLM(FakeOpenAI):
    """The shared fake server (tests/fake_openai.py) standing in for vLLM: q's prompts get a rationale naming the
    sample's seed and index, p's prompts a marked (rationale, problem) unless the request's seed is a multiple of 4,
    chat messages a boxed answer that is right for every second sample; choices in reverse index order. With
    `fail_first` the first POST is answered 503 (the client retries). `url` is the server's root, as vllm_cfg takes
    it."""

    def __init__(self, name, fail_first=False):
        super().__init__(self.answer, name=name, fail=int(fail_first))
        self.url = self.url.removesuffix("/v1")

    def answer(self, path, body):
        return [self.choice(body, j) for j in range(body["n"])][::-1]

    def choice(self, body, j):
        if "messages" in body:
            text = body["messages"][0]["content"]
            value = {"Find 3 times 11.": 33, "Find 2 to the fifth.": 32, "Find 7 plus 8.": 15, "Find 6 times 7.": 42}
            right = next(v for k, v in value.items() if text.startswith(k))
            answer = right if j % 2 == 0 else right + 1
            return {"index": j, "message": {"content": f"think \\boxed{{{answer}}}"}, "finish_reason": "stop"}
        prompt = body["prompt"]
        if prompt.endswith(lt.RATIONALE[0] + "\n"):
            text = f"Use the concepts, variant {body['seed'] % 1000} {j}."
        else:
            text = lt.p_completion(f"plan {j}", f"Find {body['seed']} squared.") if body["seed"] % 4 else "garbled"
        return {"index": j, "text": text, "finish_reason": "stop"}


@pytest.fixture
def fake_vllm():
    servers = []

    def start(name, fail_first=False):
        servers.append(FakeVLLM(name, fail_first))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def vllm_cfg(base_url, **kw):
    return {
        "base_url": base_url,
        "port": 8000,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 4096,
        "startup_timeout_s": 10,
        "request_timeout_s": 10,
        "max_concurrency": 3,
        "retries": 2,
        **kw,
    }


def test_the_client_asks_n_samples_per_prompt_with_its_seed_and_retries_a_503(fake_vllm):
    fake = fake_vllm("q0", fail_first=True)
    client = serve.Client(fake.url + "/v1", "q0", timeout_s=10, retries=2, backoff_s=0, concurrency=3)
    prompts = [lt.q_prompt(["a"], "AMC12", f"problem {i}") for i in range(5)]
    out = vllm_server.complete_each(
        client, prompts, n=3, temperature=1.0, top_p=1.0, max_tokens=64, seed=100, stop=["END"]
    )
    assert [len(o) for o in out] == [3] * 5
    assert out[2][1]["text"] == "Use the concepts, variant 102 1."  # choices reordered by index, prompt 2's seed
    body = next(b for b in fake.bodies if b["prompt"] == prompts[4])
    assert body | {"prompt": None} == {
        "model": "q0",
        "prompt": None,
        "n": 3,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 64,
        "seed": 104,
        "stop": ["END"],
    }
    with pytest.raises(serve.ServerError, match="HTTP 404"):
        vllm_server.complete_each(
            serve.Client(fake.url + "/v1", "p9", timeout_s=10, retries=0),
            ["x"],
            n=1,
            temperature=1.0,
            top_p=1.0,
            max_tokens=4,
            seed=0,
        )


def test_the_serve_command_line_of_a_generation_job():
    cmd = vllm_server.serve_command("/m/q0", "q0", vllm_cfg(None, tensor_parallel_size=2), "bfloat16")
    assert cmd[:3] == ["vllm", "serve", "/m/q0"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags == {
        "--served-model-name": "q0",
        "--host": "127.0.0.1",
        "--port": "8000",
        "--tensor-parallel-size": "2",
        "--gpu-memory-utilization": "0.9",
        "--max-model-len": "4096",
        "--dtype": "bfloat16",
        "--generation-config": "vllm",
    }


def test_several_gpus_run_trl_under_torchrun_with_fsdp_and_unknown_sft_keys_are_refused(cfg):
    cmd = sft.command(8, "/x/args.json")
    assert cmd[1:] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=8",
        "-m",
        "paperflow.promptscale.sft",
        "/x/args.json",
    ]
    many = sft.sft_arguments(cfg["sft"], "/o", "cuda", world_size=8)
    one = sft.sft_arguments(cfg["sft"], "/o", "cpu", world_size=1)
    assert many["fsdp"] == cfg["sft"]["fsdp"] and "fsdp" not in one
    assert one["use_cpu"] and one["completion_only_loss"] and not many["use_cpu"]
    with pytest.raises(ConfigError, match="'learning_rat'"):
        sft.check_settings({**cfg["sft"], "learning_rat": 1.0})


def test_scoring_uses_the_token_layout_trl_trains_on(tiny_model_folder, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(tiny_model_folder)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder)
    pairs = lt.pairs_p([{"concepts": CONCEPTS[:2], "difficulty": "AMC12", "rationale": "r one", "problem": "x 1"}])
    pairs += lt.pairs_q([{"concepts": CONCEPTS[1:4], "difficulty": "AIME", "rationale": "plan two", "problem": "x 2"}])
    args = sft.sft_arguments(
        {"learning_rate": 1e-3, "per_device_train_batch_size": 1, "max_length": 512, "seed": 0}, tmp_path, "cpu", 1
    )
    trainer = SFTTrainer(
        model=model, args=SFTConfig(**args), train_dataset=Dataset.from_list(pairs), processing_class=tok
    )
    for row, pair in zip(trainer.train_dataset, pairs):
        ids, start = paper.trl_layout(tok, pair["prompt"], pair["completion"])
        assert row["input_ids"] == ids
        assert row["labels"] == [-100] * start + ids[start:]  # TRL's loss is on the completion tokens only
    scored = paper.completion_logprobs(
        model, tok, [p["prompt"] for p in pairs], [p["completion"] for p in pairs], 2, "cpu"
    )
    import torch

    for pair, value in zip(pairs, scored):
        ids, start = paper.trl_layout(tok, pair["prompt"], pair["completion"])
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)
        manual = sum(float(logp[i - 1, ids[i]]) for i in range(start, len(ids)))
        assert value == pytest.approx(manual, abs=1e-3)


def test_the_paper_em_synthesis_and_benchmark_path_runs_end_to_end_on_a_tiny_model(hub, cfg, fake_vllm, tmp_path):
    from paperflow.core.report import publish

    d = tmp_path
    sft_settings = {
        "learning_rate": 5e-3,
        "per_device_train_batch_size": 4,
        "max_length": 512,
        "seed": 0,
        "max_steps": 2,
        "bf16": False,
    }
    em = {**cfg["llm_em"], "iterations": 1, "k": 3, "max_rationale_tokens": 32, "score_batch_size": 4}
    for name in ("seeds", *cfg["benchmarks"]):
        paper.download_corpus(name, pinned(cfg["corpora"][name]), str(d / "cache"), str(d / f"{name}.jsonl"))
    download_model(
        cfg["models"]["prompt"],
        slug="promptscale",
        key="models.prompt.revision",
        cache=str(d / "cache"),
        out=str(d / "prompt.json"),
        extra={"role": "prompt"},
    )
    download_model(
        cfg["models"]["policy"],
        slug="promptscale",
        key="models.policy.revision",
        cache=str(d / "cache"),
        out=str(d / "policy.json"),
        extra={"role": "policy"},
    )
    counts = paper.preprocess(
        str(d / "seeds.jsonl"),
        {"n_train": 100, "n_heldout": 6, "seed": 0},
        str(d / "train.jsonl"),
        str(d / "heldout.jsonl"),
    )
    assert counts == {"seeds": 24, "distinct": 24, "train": 18, "heldout": 6}

    def train(which, m):
        inputs = {
            "train": str(d / "train.jsonl"),
            "start": str(d / ("prompt.json" if m == 0 else f"{which}{m - 1}.json")),
        }
        if m:
            inputs["kept"] = str(d / f"kept{m - 1}.jsonl")
        return paper.fine_tune_job(
            which, m, inputs, sft_settings, "cpu", 1, str(d / f"{which}{m}.json"), str(d / f"history_{which}{m}.json")
        )

    bounds = []
    for m in (0, 1):
        assert train("q", m)["rows"] == 18 and train("p", m)["rows"] == 18
        fake = fake_vllm(f"q{m}")
        rows = paper_generate.sample_rationales(
            lt.model_folder(d / f"q{m}.json"),
            str(d / "train.jsonl"),
            str(d / "heldout.jsonl"),
            m,
            em,
            vllm_cfg(fake.url),
            "bfloat16",
            str(d / f"samples{m}.jsonl"),
            str(d / "vllm.log"),
        )
        assert rows == ({"heldout": 6, "train": 18} if m == 0 else {"heldout": 6})  # m = E: held-out only
        assert {b["stop"][0] for b in fake.bodies} == {lt.RATIONALE[1]}
        bounds.append(
            paper.score_estep(
                m,
                lt.model_folder(d / f"p{m}.json"),
                lt.model_folder(d / f"q{m}.json"),
                str(d / "train.jsonl"),
                str(d / "heldout.jsonl"),
                str(d / f"samples{m}.jsonl"),
                em,
                {**cfg["models"]["prompt"], "device": "cpu", "dtype": "float32"},
                4,
                str(d / f"kept{m}.jsonl"),
                str(d / f"bound{m}.json"),
            )
        )
    assert all(b["heldout_items"] == 6 and b["heldout_bound"] < 0 for b in bounds)
    assert bounds[0]["kept_reward"] == pytest.approx(bounds[0]["best_reward"])  # best-of-K keeps the argmax
    kept = lt.read_jsonl(d / "kept0.jsonl")
    assert len(kept) == 18 and all(r["rationale"].startswith("Use the concepts, variant") for r in kept)
    assert lt.read_jsonl(d / "kept1.jsonl") == [] and bounds[1]["train_items"] == 0
    from safetensors.torch import load_file

    w0 = load_file(Path(lt.model_folder(d / "q0.json")) / "model.safetensors")
    w1 = load_file(Path(lt.model_folder(d / "q1.json")) / "model.safetensors")
    assert any(not (w0[k] == w1[k]).all() for k in w0)  # the M-step trained q_1 from q_0

    synthesis = []
    for variant, m in (("coldstart", 0), ("em", 1)):
        fake = fake_vllm(f"p_{variant}")
        synthesis.append(
            paper_generate.synthesize(
                lt.model_folder(d / f"p{m}.json"),
                str(d / "heldout.jsonl"),
                variant,
                {**cfg["llm_synthesis"], "n": 8},
                vllm_cfg(fake.url),
                "bfloat16",
                str(d / f"synth_{variant}.jsonl"),
                str(d / "vllm.log"),
            )
        )
    assert [s["validity"] for s in synthesis] == [0.75, 0.75]  # prompts 0 and 4 of 8 garbled (seed = 0 + index)
    assert [s["distinct_problems"] for s in synthesis] == [1.0, 1.0]
    assert lt.read_jsonl(d / "synth_em.jsonl")[1]["problem"] == "Find 1 squared."

    evals = []
    for bench in cfg["benchmarks"]:
        fake = fake_vllm("base")
        evals.append(
            paper_generate.evaluate_benchmark(
                lt.model_folder(d / "policy.json"),
                "base",
                str(d / f"{bench}.jsonl"),
                bench,
                {**cfg["llm_eval"], "samples": 4},
                vllm_cfg(fake.url),
                "bfloat16",
                str(d / f"eval_{bench}.jsonl"),
                str(d / "vllm.log"),
            )
        )
        assert fake.bodies[0]["top_k"] == cfg["llm_eval"]["top_k"]
    assert [e["avg_at_k"] for e in evals] == [50.0, 50.0, 50.0]  # every second sample is right

    params = {
        "models": cfg["models"],
        "llm_em": em,
        "llm_eval": cfg["llm_eval"],
        "benchmarks": cfg["benchmarks"],
        "scale": "paper",
    }
    from paperflow.promptscale.paper_report import build_report

    outputs = {
        k: str(d / "report" / f"{k}.{ext}")
        for k, ext in [
            ("report", "md"),
            ("metrics", "json"),
            ("table_em", "csv"),
            ("table_synthesis", "csv"),
            ("table_benchmarks", "csv"),
            ("figure_em", "png"),
            ("metrics_table", "parquet"),
        ]
    }
    claims = [c for c in cfg["claims"] if c["id"] in ("paper_heldout_bound_rises", "paper_validity_em_minus_coldstart")]
    doc = publish(
        build_report(bounds, synthesis, evals, params), outputs, paper="promptscale", scale="paper", claims=claims
    )
    claim = {c["id"]: c for c in doc["claims"]}
    assert claim["paper_heldout_bound_rises"]["value"] == pytest.approx(
        bounds[1]["heldout_bound"] - bounds[0]["heldout_bound"]
    )
    assert claim["paper_validity_em_minus_coldstart"]["value"] == 0.0
    table = pd.read_csv(outputs["table_benchmarks"])
    assert table.set_index("benchmark")["paper_base_4b"].to_dict() == {
        "aime24": 85.2,
        "aime25": 81.3,
        "hmmt_feb25": 55.5,
    }


def test_best_of_k_keeps_the_argmax_random_of_k_a_uniform_one_and_the_bound_is_the_iwae_formula():
    rows = [{"split": "train", "index": i, "rationales": ["a", "b", "c"]} for i in range(60)]
    rows.append({"split": "heldout", "index": 0, "rationales": ["a", "b"]})
    rewards = [-1.0, -5.0, -9.0] * 60 + [-2.0, -4.0]
    log_q = [-3.0] * 180 + [-1.0, -0.5]
    picks = {}
    for select in ("best", "random"):
        kept, summary = paper.select_kept(rows, rewards, log_q, {"select": select, "k": 3}, 1)
        picks[select] = [r["rationale"] for r in kept]
        assert summary["heldout_bound"] == pytest.approx(math.log((math.exp(-1.0) + math.exp(-3.5)) / 2))
    assert set(picks["best"]) == {"a"}
    assert set(picks["random"]) == {"a", "b", "c"}  # the control: 60 uniform draws of 3
    with pytest.raises(ValueError, match="llm_em.select"):
        paper.select_kept(rows, rewards, log_q, {"select": "worst", "k": 3}, 1)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("benchmarks: [aime24, aime25, hmmt_feb25]", "benchmarks: [aime24, aime26]"), "aime26"),
        (("    tensor_parallel_size: 1\n", "    tensor_parallel_size: 2\n"), "tensor_parallel_size"),
        (("    weight_decay: 0.01\n    max_length", "    weight_dacay: 0.01\n    max_length"), "weight_dacay"),
        (
            (
                "      revision: null                 # no published commit found (config/unpinned.yaml): `paperflow pin "
                'promptscale`\n      files: ["*.parquet", "*.jsonl"',
                '      revision: main\n      files: ["*.parquet", "*.jsonl"',
            ),
            "revision",
        ),
    ],
)
def test_paper_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "promptscale.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("promptscale", "paper", repo_copy)


def test_paper_scale_dry_run_puts_gpus_on_the_heavy_rules_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[promptscale]")
    cfg = load_paper_config("promptscale", "paper")
    e, n_bench, n_code = cfg["llm_em"]["iterations"], len(cfg["benchmarks"]), len(cfg["code_benchmarks"])
    counts = dict(re.findall(r"^(promptscale_\w+)\s+(\d+)$", proc.stdout, re.M))
    n_annot = len(cfg["annotate"]["annotators"]) if "code" in cfg["seeds_data"]["domains"] else 0  # code seeds
    annotate = {"promptscale_download_annotator": str(n_annot), "promptscale_annotate": str(n_annot)}
    code_sp = {f"promptscale_code_{s}": "1" for s in ("tests", "rollouts", "verify", "pairs")}  # code self-play
    assert counts == (annotate | code_sp if n_annot else {}) | {
        "promptscale_download_model": str(2 + (n_annot > 0)),  # prompt, policy (and the code tests' tester)
        "promptscale_download": str(3 + n_bench + n_code + (n_annot > 0)),  # seeds, traces, codeelo, benchmarks, cf
        "promptscale_codeforces_generate": "3",  # the three policies' Codeforces attempts (no verdicts: no Elo job)
        "promptscale_preprocess": "1",
        "promptscale_train": str(2 * (e + 1)),
        "promptscale_sample": str(e + 1),
        "promptscale_score": str(e + 1),
        "promptscale_synthesize": "2",
        "promptscale_evaluate": str(3 * n_bench),  # the base, self-play and SFT policies
        "promptscale_evaluate_code": str(3 * n_code),
        "promptscale_sft": "1",
        "promptscale_rollouts": "1",
        "promptscale_pairs": "1",
        "promptscale_dpo": "1",
        "promptscale_report": "1",
    }
    gpus = {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
    res = cfg["resources"]
    for rule in ("promptscale_train", "promptscale_dpo", "promptscale_sft"):  # one node's GPUs each
        assert gpus.pop(rule) == {res["train_gpus"]}, rule
    for rule in (
        "promptscale_sample",
        "promptscale_synthesize",
        "promptscale_evaluate",
        "promptscale_evaluate_code",
        "promptscale_rollouts",
        "promptscale_codeforces_generate",
    ):
        assert gpus.pop(rule) == {res["sample_gpus"]}
    assert gpus.pop("promptscale_score") == {res["score_gpus"]}
    gpus.pop("promptscale_annotate", None)  # one count per annotator: test_promptscale_code_seeds.py
    for rule in ("promptscale_code_tests", "promptscale_code_rollouts"):  # test_promptscale_code_selfplay.py
        gpus.pop(rule, None)
    assert all(v == {0} for v in gpus.values()), gpus


# --- self-play: rollouts -> verified pairs -> TRL DPO -> the self-play policy on a benchmark ---------------------------

SELFPLAY = {
    "source": "em",
    "max_problems": None,
    "seeds": 2,
    "completions_per_seed": 4,
    "temperature": 1.2,
    "top_p": 1.0,
    "top_k": -1,
    "max_tokens": 64,
    "seed": 10,
    "max_pass_rate": 0.5,
    "max_pairs_per_problem": 4,
    "require_think": True,
}


def rollout_texts(i: int, seed: int) -> list[str]:
    """The 4 samples the fake policy writes for problem i ("Find i squared.") in a request with `seed`. 0: always
    right (too easy); 1: two right, one wrong, one without </think> (half right by majority vote); 2: never a boxed
    answer (unsolved); 3: all answers different, none closes its reasoning (nothing well-formed to pair)."""
    if i == 0:
        return [f"square it {seed} {j}</think> so \\boxed{{0}}" for j in range(4)]
    if i == 1:
        return [
            f"one {seed} 0</think> \\boxed{{1}}",
            f"one {seed} 1</think> \\boxed{{1}}",
            f"guess {seed}</think> \\boxed{{7}}",
            "no closing tag \\boxed{9}",
        ]
    if i == 2:
        return [f"I give up {seed} {j}</think> no answer" for j in range(4)]
    return [f"maybe \\boxed{{{seed * 10 + j}}}" for j in range(4)]


def test_pairs_are_built_as_promptcot_builds_them_from_hand_made_rollouts():
    from paperflow.promptscale import selfplay as sp

    rows = [
        {"id": i, "problem": f"Find {i} squared.", "completions": rollout_texts(i, 1) + rollout_texts(i, 2)}
        for i in range(4)
    ]
    assert sp.majority_answer(rows[1]["completions"]) == "1"  # 4 x "1", 2 x "7", 2 x "9"
    assert sp.grade(rows[1]["completions"])[1] == [True, True, False, False] * 2
    assert sp.grade(rows[1]["completions"], reference="7")[1] == [False, False, True, False] * 2  # a given answer
    assert sp.grade(rows[2]["completions"]) == (None, [False] * 8)
    assert sp.well_formed("a</think> \\boxed{3}", True) and sp.well_formed("\\boxed{3}", False)
    assert not sp.well_formed("\\boxed{3}", True) and not sp.well_formed("</think> \\boxed{3}", True)
    assert not sp.well_formed("a</think> b</think> \\boxed{3}", True) and not sp.well_formed("a</think> 3", True)
    pairs, summary = sp.build_pairs(rows, SELFPLAY)
    assert summary == {
        "problems": 4,
        "problems_paired": 1,
        "problems_unsolved": 1,
        "problems_too_easy": 1,
        "problems_no_valid": 1,
        "pairs": 2,  # min(4 distinct chosen, 2 distinct well-formed rejected)
        "mean_pass_rate": pytest.approx((1 + 0.5 + 0 + 0.125) / 4),
    }
    assert sorted((p["chosen"], p["rejected"]) for p in pairs) == [
        ("one 1 0</think> \\boxed{1}", "guess 1</think> \\boxed{7}"),
        ("one 1 1</think> \\boxed{1}", "guess 2</think> \\boxed{7}"),
    ]
    assert {p["id"] for p in pairs} == {1} and {p["reference"] for p in pairs} == {"1"}
    capped, _ = sp.build_pairs(rows, {**SELFPLAY, "max_pairs_per_problem": 1})
    assert len(capped) == 1
    strict, s = sp.build_pairs(rows, {**SELFPLAY, "max_pass_rate": 0.4})  # problem 1 is now too easy too
    assert strict == [] and s["problems_too_easy"] == 2


def test_self_play_rollouts_pairs_dpo_and_evaluation_run_end_to_end_on_a_tiny_model(tiny_model_folder, tmp_path):
    from safetensors.torch import load_file

    from paperflow.promptscale import dpo, paper_report
    from paperflow.promptscale import selfplay as sp

    synth = [{"problem": f"Find {i} squared.", "valid": True} for i in range(4)]
    synth.insert(2, {"problem": "Find 1 squared.", "valid": True})  # a repeat: played once
    synth.append({"problem": None, "valid": False})
    lt.write_jsonl(tmp_path / "synth.jsonl", synth)

    def policy(path, body):
        assert path.endswith("/chat/completions") and body["n"] == 4, path
        i = int(re.match(r"Find (\d) squared\.\n\n", body["messages"][0]["content"]).group(1))
        return chat_choices(rollout_texts(i, body["seed"]))

    with FakeOpenAI(policy, name="base") as server:
        summary = sp.rollouts(
            str(tiny_model_folder),
            str(tmp_path / "synth.jsonl"),
            SELFPLAY,
            vllm_cfg(server.url.removesuffix("/v1")),
            "bfloat16",
            str(tmp_path / "rollouts.jsonl"),
            str(tmp_path / "vllm.log"),
        )
        bodies = list(server.bodies)
    assert summary == {"problems": 4, "completions": 32, "truncated": 0.0}
    assert sorted(b["seed"] for b in bodies) == [10, 11, 12, 13, 14, 15, 16, 17]  # pass s, problem i: 10 + 4 s + i
    assert {(b["temperature"], b["max_tokens"], b["top_k"]) for b in bodies} == {(1.2, 64, -1)}
    rows = lt.read_jsonl(tmp_path / "rollouts.jsonl")
    assert [r["id"] for r in rows] == [0, 1, 3, 4]  # synthesis rows, repeat and invalid dropped
    assert rows[1]["completions"][4:] == rollout_texts(1, 15)

    counts = sp.pairs_job(str(tmp_path / "rollouts.jsonl"), SELFPLAY, str(tmp_path / "pairs.jsonl"))
    assert counts["pairs"] == 2 and counts["problems_paired"] == 1
    with pytest.raises(ValueError, match="no DPO pair"):
        sp.pairs_job(str(tmp_path / "rollouts.jsonl"), {**SELFPLAY, "max_pass_rate": 0.1}, str(tmp_path / "x.jsonl"))

    (tmp_path / "policy.json").write_text(json.dumps({"folder": str(tiny_model_folder)}))
    settings = {
        "beta": 0.1,
        "loss_type": "sigmoid",
        "learning_rate": 1e-2,
        "per_device_train_batch_size": 2,
        "max_length": 256,
        "seed": 0,
        "max_steps": 2,
        "bf16": False,
        "gradient_checkpointing": False,
    }
    out = dpo.dpo_job(
        str(tmp_path / "policy.json"),
        str(tmp_path / "pairs.jsonl"),
        settings,
        "cpu",
        1,
        str(tmp_path / "models" / "selfplay.json"),
        str(tmp_path / "history_dpo.json"),
    )
    history = json.loads((tmp_path / "history_dpo.json").read_text())
    assert out["steps"] == 2 and history[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)  # pi = pi_ref at step 1
    assert history[1]["rewards/margins"] > 0  # the step raised the chosen log-ratio over the rejected one
    before = load_file(Path(tiny_model_folder) / "model.safetensors")
    after = load_file(tmp_path / "models" / "selfplay" / "model.safetensors")
    assert any(not (before[k] == after[k]).all() for k in before)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "models" / "selfplay")
    assert dpo.chat_prompt(tok, "Find 1 squared.").endswith("<|im_start|>assistant\n<think>\n")
    with pytest.raises(ConfigError, match="'betta'"):
        dpo.check_settings({**settings, "betta": 0.1})

    evals = []
    for name, right in (("base", 1), ("selfplay", 2)):  # right answers among 4 samples

        def answer(path, body, right=right):
            return chat_choices([f"r</think> \\boxed{{{15 if j < right else 16}}}" for j in range(body["n"])])

        lt.write_jsonl(tmp_path / "aime25.jsonl", [{"id": "0", "problem": "Find 7 plus 8.", "answer": "15"}])
        with FakeOpenAI(answer, name=name) as server:
            evals.append(
                paper_generate.evaluate_benchmark(
                    lt.model_folder(tmp_path / "models" / "selfplay.json"),
                    name,
                    str(tmp_path / "aime25.jsonl"),
                    "aime25",
                    {"samples": 4, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64, "seed": 0},
                    vllm_cfg(server.url.removesuffix("/v1")),
                    "bfloat16",
                    str(tmp_path / f"eval_{name}.jsonl"),
                    str(tmp_path / "vllm.log"),
                )
            )
    curve = [{"iteration": 0, "k": 4, "heldout_bound": -3.0, "kept_reward": -2.0, "best_reward": -2.0}]
    synthesis = [{"variant": "em", "n": 4, "validity": 1.0}]
    params = {
        "models": load_paper_config("promptscale", "paper")["models"],
        "benchmarks": ["aime25"],
        "llm_em": {"iterations": 0, "k": 4, "select": "best"},
        "llm_eval": {"samples": 4},
        "scale": "paper",
    }
    report = paper_report.build_report(curve, synthesis, evals, params, {"rollouts": summary, "pairs": counts})
    from paperflow.core.claims import judge, parse_claims

    spec = next(
        s
        for s in parse_claims(load_paper_config("promptscale", "paper")["claims"], "t")
        if s.id == "paper_selfplay_gain_aime25"
    )
    claim = judge(spec, report.table, "paper")
    assert claim.effects == [25.0]  # 2 of 4 right minus 1 of 4
    table = paper_report.benchmark_table(pd.DataFrame(evals)).set_index("policy")["paper"].to_dict()
    assert table == {"base": 81.3, "selfplay": 85.0}


# --- LiveCodeBench: the release files, the sandbox, pass@1 ------------------------------------------------------------

# bubblewrap where it runs (CI installs it); the rlimits fallback elsewhere (tests/core/test_sandbox.py needs it)
LIMITS = {"timeout_s": 1, "memory_mb": 1024, "isolation": "rlimits" if sandbox.unavailable("bwrap") else "bwrap"}


def fenced(code: str) -> str:
    return f"reasoning</think>Here it is.\n```python\n{code}\n```\n"


def test_lcb_releases_are_read_by_window_with_compressed_private_tests_and_pinned_checksums(hub, cfg, tmp_path):
    import hashlib
    import pickle

    from paperflow.promptscale import code_eval

    info = {}
    for name in cfg["code_benchmarks"]:
        spec = {k: v for k, v in cfg["corpora"][name].items() if k != "sha256"}
        info[name] = paper.download_corpus(name, spec, str(tmp_path / "cache"), str(tmp_path / f"{name}.jsonl"))
    assert [c["patterns"] for c in hub] == [["test4.jsonl", "test5.jsonl"], ["test6.jsonl"]]
    assert info["lcb_v5"]["records"] == 3 and info["lcb_v5"]["rows"] == 2  # abc370_a is before 2024-08-01
    v5 = lt.read_jsonl(tmp_path / "lcb_v5.jsonl")
    assert [r["id"] for r in v5] == ["abc380_a", "weekly_1"]
    assert v5[0]["tests"] == [stdin_test(1, 2), stdin_test(5, 6), stdin_test(-1, 1)]  # public, then private
    assert v5[1]["fn_name"] == "add" and v5[1]["tests"][1] == fn_test(7, 8)
    assert [r["id"] for r in lt.read_jsonl(tmp_path / "lcb_v6.jsonl")] == ["abc395_a"]
    # a checksum in the config is checked: the real test6.jsonl's digest refuses the fake file
    with pytest.raises(ValueError, match="test6.jsonl has sha256 .* the config pins bb4c364f"):
        paper.download_corpus("lcb_v6", cfg["corpora"]["lcb_v6"], str(tmp_path / "cache"), str(tmp_path / "x.jsonl"))
    folder = next((tmp_path / "cache").rglob("test6.jsonl")).parent
    right = hashlib.sha256((folder / "test6.jsonl").read_bytes()).hexdigest()
    spec = {**cfg["corpora"]["lcb_v6"], "sha256": {"test6.jsonl": right}}
    assert paper.download_corpus("lcb_v6", spec, str(tmp_path / "cache"), str(tmp_path / "y.jsonl"))["rows"] == 1
    # the compressed field admits a pickled string only
    import base64
    import zlib

    evil = base64.b64encode(zlib.compress(pickle.dumps(Path("/")))).decode()
    with pytest.raises(pickle.UnpicklingError, match="a string only"):
        code_eval.decode_tests(evil)


def test_the_sandbox_passes_a_correct_solution_and_fails_wrong_timing_out_crashing_and_missing_code():
    from paperflow.promptscale import code_eval

    stdin_row = {"id": "abc", "tests": [stdin_test(1, 2), stdin_test(5, 6), stdin_test(-1, 1)], "fn_name": None}
    right = "a, b = map(int, input().split())\nprint(a + b)"
    cases = {
        "right": (right, True, "pass", 3),
        "wrong": ("a, b = map(int, input().split())\nprint(a - b)", False, "wrong", 1),  # stops at the first failure
        "spins": ("while True:\n    pass", False, "timeout", 1),
        "crash": ("raise RuntimeError('boom')", False, "error", 1),
    }
    for name, (code, passed, status, run) in cases.items():
        got = code_eval.grade(fenced(code), stdin_row, LIMITS)
        assert got == {"passed": passed, "status": status, "tests_run": run}, name
    assert code_eval.grade("no fence here", stdin_row, LIMITS)["status"] == "no_code"
    assert code_eval.extract_code("```python\nx = 1\n```</think>```python\nprint(2)\n```") == "print(2)"
    assert code_eval.same_stdout("3.0 \n4\n\n", "3\n4") and not code_eval.same_stdout("3\n5", "3\n4")
    fn_row = {"id": "w", "tests": [fn_test(1, 2), fn_test(7, 8)], "fn_name": "add"}
    good = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        print('noise')\n        return a + b"
    assert code_eval.grade(fenced(good), fn_row, LIMITS)["passed"]
    assert code_eval.grade(fenced(good.replace("a + b", "a * b")), fn_row, LIMITS)["status"] == "wrong"
    assert code_eval.pass_at_1([[True, False], [False, False], [True, True]]) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="isolation = 'host'"):
        code_eval.check_limits({**LIMITS, "isolation": "host"})
    for tokens in ("sNaN", "-sNaN 1", "NaN", "nan", "1e999999999", "\ufffd"):  # never raises; NaN only as equal text
        assert not code_eval.same_stdout(tokens, "1") and code_eval.same_stdout(tokens, tokens)
    assert not code_eval.same_value("[" * 100_000, "1") and not code_eval.same_value("1" * 5000, "1")


def test_the_code_evaluation_samples_the_policy_and_reports_lcb_pass_at_1(tmp_path):

    from paperflow.promptscale import code_eval

    rows = [
        {"id": "abc", "fn_name": None, "starter_code": "", "problem": "add", "tests": [stdin_test(1, 2)]},
        {
            "id": "w",
            "fn_name": "add",
            "starter_code": "class Solution:\n    def add(self, a, b):\n",
            "problem": "add",
            "tests": [fn_test(1, 2)],
        },
    ]
    lt.write_jsonl(tmp_path / "lcb.jsonl", rows)
    right = {
        "abc": "a, b = map(int, input().split())\nprint(a + b)",
        "w": "class Solution:\n    def add(self, a, b):\n        return a + b",
    }

    def policy(path, body):
        message = body["messages"][0]["content"]
        ident = "w" if "starter code" in message else "abc"
        assert ("standard input" in message) == (ident == "abc")
        return chat_choices(
            [fenced(right[ident]), "no code"][: body["n"]] if ident == "abc" else [fenced(right[ident])] * body["n"]
        )

    settings = {"samples": 2, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64, "seed": 0}
    with FakeOpenAI(policy, name="base") as server:
        summary = code_eval.evaluate_code(
            "/m",
            "base",
            str(tmp_path / "lcb.jsonl"),
            "lcb_v6",
            settings,
            LIMITS,
            vllm_cfg(server.url.removesuffix("/v1")),
            "bfloat16",
            str(tmp_path / "graded.jsonl"),
            str(tmp_path / "vllm.log"),
            2,
        )
    assert summary["pass_at_1"] == summary["avg_at_k"] == pytest.approx(75.0)  # (1/2 + 2/2) / 2
    graded = lt.read_jsonl(tmp_path / "graded.jsonl")
    assert [g["status"] for g in graded] == [["pass", "no_code"], ["pass", "pass"]]
    with pytest.raises(RuntimeError, match="cannot run a correct program .*'memory_mb': 1"):
        code_eval.preflight({**LIMITS, "memory_mb": 1})  # 1 MB of address space: not even the interpreter starts


def test_the_code_evaluation_with_the_jobs_journal_asks_and_grades_only_what_it_lacks(tmp_path):
    """evaluate_code with a journal: the samples (problem i seeded `seed + i` of all problems) and the graded
    problems are journalled; a rerun missing a problem's grade grades it from the journalled samples without the
    server, one missing a problem's samples asks for that problem only, with its own seed; the bytes are the same."""
    from paperflow.promptscale import code_eval

    rows = [
        {"id": "abc", "fn_name": None, "starter_code": "", "problem": "add", "tests": [stdin_test(1, 2)]},
        {"id": "xyz", "fn_name": None, "starter_code": "", "problem": "add", "tests": [stdin_test(5, 6)]},
    ]
    lt.write_jsonl(tmp_path / "lcb.jsonl", rows)
    right = fenced("a, b = map(int, input().split())\nprint(a + b)")
    settings = {"samples": 2, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64, "seed": 0}

    def policy(path, body):
        return chat_choices([right, f"no code {body['seed']}"])

    def run(out, journal, up=True):
        with FakeOpenAI(policy, name="base") as server:
            vllm = vllm_cfg(server.url.removesuffix("/v1") if up else "http://127.0.0.1:9", startup_timeout_s=1)
            summary = code_eval.evaluate_code(
                "/m",
                "base",
                str(tmp_path / "lcb.jsonl"),
                "lcb_v6",
                settings,
                LIMITS,
                vllm,
                "bfloat16",
                str(tmp_path / out),
                str(tmp_path / "vllm.log"),
                1,
                journal=journal,
            )
            return summary, [b["seed"] for b in server.bodies]

    whole, _ = run("whole.jsonl", None)
    journal = tmp_path / "ckpt" / "rows.jsonl"
    summary, seeds = run("j.jsonl", journal)
    assert summary == whole and sorted(seeds) == [0, 1]
    lines = journal.read_text().splitlines()
    assert sorted(json.loads(x)["id"] for x in lines) == ["graded:abc", "graded:xyz", "sample:0", "sample:1"]
    keep = [x for x in lines if json.loads(x)["id"] != "graded:xyz"]
    journal.write_text("\n".join(keep) + "\n")
    assert run("j.jsonl", journal, up=False) == (whole, [])  # no server: the samples are journalled
    assert (tmp_path / "j.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    keep = [x for x in lines if json.loads(x)["id"] not in ("graded:xyz", "sample:1")]
    journal.write_text("\n".join(keep) + "\n")
    assert run("j.jsonl", journal) == (whole, [1])  # problem 1 only, its seed 0 + 1
    assert (tmp_path / "j.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


# --- the SFT arm: the released traces, TRL SFT of the prompt model --------------------------------------------------


def test_the_sft_arm_streams_the_released_traces_and_trains_the_prompt_model_with_trl(hub, cfg, tmp_path):
    from safetensors.torch import load_file

    from paperflow.promptscale import sft_arm

    spec = pinned(cfg["corpora"]["sft_traces"])
    info = paper.download_corpus("sft_traces", spec, str(tmp_path / "cache"), str(tmp_path / "traces.jsonl"))
    assert info["records"] == 6 and info["rows"] == 5  # the empty completion dropped
    rows = lt.read_jsonl(tmp_path / "traces.jsonl")
    assert rows[4] == {"prompt": SFT_ROWS["prompt"][4], "completion": SFT_ROWS["completion"][4]}  # both files
    capped = paper.download_corpus(
        "sft_traces", {**spec, "max_rows": 2}, str(tmp_path / "cache"), str(tmp_path / "capped.jsonl")
    )
    assert capped["rows"] == 2 and lt.read_jsonl(tmp_path / "capped.jsonl") == rows[:2]
    folder = next((tmp_path / "cache").rglob("train-00000-of-00002.parquet")).parent
    pd.DataFrame({"messages": [[{"role": "user", "content": "x"}]]}).to_parquet(folder / "train-00000-of-00002.parquet")
    with pytest.raises(ValueError, match="no string prompt and completion .* columns: {'messages': 'list'}"):
        sft_arm.download_traces("sft_traces", spec, folder.parent, str(tmp_path / "bad.jsonl"))

    download_model(
        cfg["models"]["prompt"],
        slug="promptscale",
        key="models.prompt.revision",
        cache=str(tmp_path / "cache"),
        out=str(tmp_path / "prompt.json"),
        extra={"role": "prompt"},
    )
    settings = {
        **cfg["sft_arm"],
        "max_steps": 2,
        "bf16": False,
        "gradient_checkpointing": False,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1e-2,
        "max_length": 256,
        "warmup_steps": 0,
    }
    summary = sft_arm.sft_job(
        str(tmp_path / "prompt.json"),
        str(tmp_path / "traces.jsonl"),
        settings,
        "cpu",
        1,
        str(tmp_path / "models" / "sft.json"),
        str(tmp_path / "history.json"),
    )
    assert summary["steps"] == 2 and summary["final_loss"] > 0
    start = load_file(Path(lt.model_folder(tmp_path / "prompt.json")) / "model.safetensors")
    after = load_file(Path(lt.model_folder(tmp_path / "models" / "sft.json")) / "model.safetensors")
    assert any(not (start[k] == after[k]).all() for k in start)


def test_read_snapshot_records_reads_every_layout_in_path_order_and_names_what_the_folder_holds(tmp_path):
    (tmp_path / "data").mkdir()
    pd.DataFrame({"x": [1, 2]}).to_parquet(tmp_path / "data" / "a.parquet")
    (tmp_path / "data" / "b.jsonl").write_text('{"x": 3}\n\n{"x": 4}\n')
    (tmp_path / "data" / "c.json").write_text(json.dumps([{"x": 5}]))
    (tmp_path / "data" / "d.json").write_text('{"x": 6}\n{"x": 7}\n')  # JSON lines under a .json name
    (tmp_path / "data" / "e.json").write_text('{"x": 8}')
    (tmp_path / "data" / "f.csv").write_text("x\n9\n")  # matched but not a record format: skipped
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "g.json").write_text('{"x": 10}')
    rows = lt.read_snapshot_records(tmp_path, ["data/*", ".cache/*"])
    assert [int(r["x"]) for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [r["x"] for r in lt.read_snapshot_records(tmp_path, ["data/c.json"])] == [5]
    with pytest.raises(
        FileNotFoundError, match=r"no parquet/jsonl/json file matches \['test\.json'\]; it holds .*data/a"
    ):
        lt.read_snapshot_records(tmp_path, ["test.json"])


# --- long jobs resume (issue 43) ----------------------------------------------------------------------------------


def test_rollouts_cut_off_part_way_rerun_with_their_journal_ask_only_for_the_rest_and_write_the_same_bytes(
    tiny_model_folder, tmp_path
):
    """The rollouts (selfplay.play, as every vLLM rule: vllm_server.chat_each) journal each finished request in the
    job's checkpoint folder; a server lost after 3 of the 8 requests fails the job with those 3 journalled, and the
    rerun sends only the 5 others, with their own seeds, and writes the bytes of an uninterrupted run."""
    import threading

    from paperflow.promptscale import selfplay as sp

    synth = [{"problem": f"Find {i} squared.", "valid": True} for i in range(4)]
    lt.write_jsonl(tmp_path / "synth.jsonl", synth)
    answered, lock = [], threading.Lock()

    def policy(path, body, up_to=None):
        with lock:
            if up_to is not None and len(answered) >= up_to:
                raise AssertionError("the server went away")
            answered.append(body["seed"])
        i = int(re.match(r"Find (\d) squared\.\n\n", body["messages"][0]["content"]).group(1))
        return chat_choices(rollout_texts(i, body["seed"]))

    def run(answer, out, journal):
        with FakeOpenAI(answer, name="base") as server:
            try:
                return sp.rollouts(
                    str(tiny_model_folder),
                    str(tmp_path / "synth.jsonl"),
                    SELFPLAY,
                    vllm_cfg(server.url.removesuffix("/v1"), retries=0),
                    "bfloat16",
                    str(out),
                    str(tmp_path / "vllm.log"),
                    journal=journal,
                )
            finally:
                sent.append([b["seed"] for b in server.bodies])

    sent: list[list[int]] = []
    whole = run(policy, tmp_path / "whole.jsonl", None)
    assert sorted(sent[-1]) == list(range(10, 18))  # 2 passes x 4 problems
    journal = tmp_path / "checkpoints" / "rows.jsonl"
    answered.clear()
    with pytest.raises(serve.ServerError):
        run(lambda path, body: policy(path, body, up_to=3), tmp_path / "cut.jsonl", journal)
    first = list(answered)
    assert len(first) == 3 and len(journal.read_text().splitlines()) == 3
    assert not (tmp_path / "cut.jsonl").exists()
    summary = run(policy, tmp_path / "cut.jsonl", journal)
    assert sorted(sent[-1]) == sorted(set(range(10, 18)) - set(first))  # only the 5 missing, with their seeds
    assert summary == whole
    assert (tmp_path / "cut.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    # all journalled: a rerun asks for nothing; other sampling at the same places is refused
    run(policy, tmp_path / "again.jsonl", journal)
    assert sent[-1] == [] and (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    with pytest.raises(ValueError, match="journalled for another request"):
        with FakeOpenAI(policy, name="base") as server:
            sp.rollouts(
                str(tiny_model_folder),
                str(tmp_path / "synth.jsonl"),
                {**SELFPLAY, "temperature": 0.7},
                vllm_cfg(server.url.removesuffix("/v1")),
                "bfloat16",
                str(tmp_path / "x.jsonl"),
                str(tmp_path / "vllm.log"),
                journal=journal,
            )


def test_sft_killed_after_a_checkpoint_resumes_from_it_and_ends_as_an_uninterrupted_run(
    tiny_model_folder, tmp_path, monkeypatch
):
    """With the job's checkpoint folder (the sft rule's `checkpoint_dir`) TRL saves there and trains through
    paperflow.core.lm.resume.train: a run killed after step 1's checkpoint, rerun, trains steps 2 and 3 only and ends
    with the weights and losses of an uninterrupted run."""
    from safetensors.torch import load_file

    from paperflow.core.lm import resume
    from paperflow.promptscale import sft_arm

    rows = [{"prompt": f"Find {i} plus {i}. ", "completion": f"It is {2 * i}."} for i in range(6)]
    lt.write_jsonl(tmp_path / "traces.jsonl", rows)
    (tmp_path / "start.json").write_text(json.dumps({"folder": str(tiny_model_folder)}))
    settings = {
        "learning_rate": 1e-2,
        "per_device_train_batch_size": 2,
        "max_length": 64,
        "seed": 0,
        "max_steps": 3,
        "bf16": False,
        "gradient_checkpointing": False,
        "warmup_steps": 0,
    }

    def job(name, checkpoint_dir=None):
        out = tmp_path / name / "sft.json"
        sft_arm.sft_job(
            str(tmp_path / "start.json"),
            str(tmp_path / "traces.jsonl"),
            settings,
            "cpu",
            1,
            str(out),
            str(tmp_path / name / "history.json"),
            checkpoint_dir,
        )
        losses = [r["loss"] for r in json.loads((tmp_path / name / "history.json").read_text()) if "loss" in r]
        return load_file(Path(lt.model_folder(out)) / "model.safetensors"), losses

    (tmp_path / "whole").mkdir()
    (tmp_path / "resumed").mkdir()
    whole, whole_losses = job("whole")
    steps = []

    class EveryStep(resume.TimedSave):  # a checkpoint after every step (the rule's: every 30 min)
        def __init__(self, every_s=0, clock=None):
            super().__init__(0)

        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)
            return super().on_step_end(args, state, control, **kwargs)

    class KilledAfterStep1(EveryStep):
        def on_save(self, args, state, control, **kwargs):
            out = super().on_save(args, state, control, **kwargs)
            if state.global_step == 1:
                raise RuntimeError("killed")
            return out

    folder = tmp_path / "checkpoints" / "promptscale_sft"
    monkeypatch.setattr(resume, "TimedSave", KilledAfterStep1)
    with pytest.raises(RuntimeError, match="killed"):
        job("resumed", str(folder))
    assert steps == [1] and resume.last_checkpoint(folder).endswith("checkpoint-1")
    steps.clear()
    monkeypatch.setattr(resume, "TimedSave", EveryStep)
    weights, losses = job("resumed", str(folder))
    assert steps == [2, 3]  # resumed at step 1, not trained from step 0
    assert losses == whole_losses and len(losses) == 3
    assert all((weights[k] == whole[k]).all() for k in whole)
