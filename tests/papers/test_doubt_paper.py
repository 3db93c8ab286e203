"""doubt at paper scale, offline: Hub parquet files in the benchmarks' real layouts and columns (written here, laid
out as snapshot_download lays them out), the downloads asking only for the pinned files and refusing an unpinned
one with `paperflow pin doubt` named, the official question rendering, answer mapping and labels, a tiny
LLaVA (CLIP vision tower + Llama, LlavaForConditionalGeneration with its processor, built from configs) through the
paper path on the CPU (sample -> label / judge -> embed -> score -> evaluate -> report), a cuda device refused
where none is, config errors by name, and the paper DAG with GPUs on exactly the sampling, judge and embedding
rules."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_hub import FakeHub, install

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.io import read_frame
from paperflow.doubt import benchmarks as bm
from paperflow.doubt import paper

SHA = "0123456789abcdef0123456789abcdef01234567"
CHAT = (
    "{% for m in messages %}{% if m['role'] == 'system' %}SYSTEM: {{ m['content'] }} {% elif m['role'] == 'user' %}"
    "USER: {% if m['content'] is string %}{{ m['content'] }} {% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}{% endif %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
WORDS = "<image> USER: ASSISTANT: SYSTEM: ( 0 1 2 3 ): cat dog red blue the answer is a Correct Wrong".split()
SAMPLING = {"n_max": 3, "temperature": 0.5, "t_answer": 0.1, "top_k": 10, "top_p": 0.99, "max_new_tokens": 3, "seed": 0}
VLM_SPEC = {
    "hub": "org/tiny-llava",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*.json", "*.safetensors"],
    "dtype": "float32",
    "device": "cpu",
    "image_first": False,
    "batch_size": 3,
    "answer_generation": {},
    "sampling_generation": {"num_beams": 1},
}
JUDGE_SPEC = {
    "hub": "org/tiny-judge",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*.json", "*.safetensors"],
    "dtype": "float32",
    "device": "cpu",
    "temperature": 0.1,
    "top_p": 0.8,
    "repetition_penalty": 1.05,
    "max_new_tokens": 3,
}
ENCODER_SPEC = {
    "hub": "org/encoder",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*"],
    "device": "cpu",
    "batch_size": 32,
}


def png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def img(seed):
    return {"bytes": png(seed), "path": None}


def hub_files() -> dict[str, pd.DataFrame]:
    """{repo path: frame} of the four benchmarks' parquet files, with their Hub columns (an image cell is
    {"bytes", "path"} as `datasets` writes it)."""
    scienceqa = pd.DataFrame(
        {
            "image": [img(0), None, img(1), img(2)],
            "question": ["Which is a cat?", "Text only?", "Which colour?", "Which animal barks?"],
            "choices": [["dog", "cat"], ["a", "b"], ["red", "blue", "green"], ["cat", "dog"]],
            "answer": [1, 0, 0, 1],
            "hint": ["", "", "", ""],
        }
    )

    def mmmu(subject):
        return pd.DataFrame(
            {
                "id": [f"validation_{subject}_{k}" for k in range(4)],
                "question": ["What is shown? <image 1>", "Compare <image 1> and <image 2>", "Open one", "Pick one"],
                "options": ["['cat', 'dog']", "['a', 'b']", "[]", "['x', 'y', 'z']"],
                "answer": ["B", "A", "42", "C"],
                "question_type": ["multiple-choice", "multiple-choice", "open", "multiple-choice"],
                "image_1": [img(3), img(4), img(5), img(6)],
                "image_2": [None, img(7), None, None],
            }
        )

    llava = pd.DataFrame(
        {
            "question_id": ["001", "002"],
            "question": ["What is in the image?", "What colour is it?"],
            "image": [img(8), img(9)],
            "gpt_answer": ["A cat on a mat.", "Red."],
            "caption": ["c", "d"],
        }
    )
    mmvet = pd.DataFrame({"question_id": ["v1"], "question": ["How many cats?"], "image": [img(10)], "answer": ["2"]})
    return {
        "data/test-00000-of-00001-abc.parquet": scienceqa,
        "data/train-00000-of-00001-abc.parquet": scienceqa.head(1),  # another split: must not be fetched
        "Art/validation-00000-of-00001.parquet": mmmu("Art"),
        "Math/validation-00000-of-00001.parquet": mmmu("Math"),
        "Math/test-00000-of-00001.parquet": mmmu("Math"),
        "llava/data/train-00000-of-00001.parquet": llava,
        "mmvet/data/test-00000-of-00001.parquet": mmvet,
    }


BENCHES = {
    "ScienceQA": {
        "hub": "org/sqa",
        "repo_type": "dataset",
        "revision": SHA,
        "files": ["data/test-*.parquet"],
        "limit": None,
    },
    "MMMU": {
        "hub": "org/mmmu",
        "repo_type": "dataset",
        "revision": SHA,
        "per_subject": 4,
        "subjects": ["Art", "Math"],
        "limit": None,
    },
    "LLaVABench": {
        "hub": "org/llava-bench",
        "repo_type": "dataset",
        "revision": SHA,
        "files": ["llava/data/train-*.parquet"],
        "limit": None,
    },
    "MMVet": {
        "hub": "org/mmvet",
        "repo_type": "dataset",
        "revision": SHA,
        "files": ["mmvet/data/test-*.parquet"],
        "limit": None,
    },
}


def word_tokenizer():
    from paperflow.core.lm.tokenizer import word_level_tokenizer

    tok = word_level_tokenizer(WORDS, chat_template=CHAT)
    tok.add_tokens(["<image>"], special_tokens=True)  # the processor writes <image><image>... without spaces
    return tok


def save_tiny_llava(folder: Path) -> None:
    """A tiny LLaVA-1.5-style model (CLIP vision tower, projector, Llama) and its processor, from configs."""
    import torch
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = word_tokenizer()
    vision = CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=14
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",  # LLaVA-1.5's: the CLS feature dropped
        image_seq_length=4,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(cfg).save_pretrained(folder)
    images = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=CHAT,
        num_additional_image_tokens=1,
    ).save_pretrained(folder)


def save_tiny_judge(folder: Path) -> None:
    from paperflow.core.lm.models import build_model, save_model
    from paperflow.core.lm.tokenizer import save_tokenizer

    tok = word_tokenizer()
    spec = {
        "arch": "llama",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
    }
    save_model(build_model({**spec, "vocab_size": len(tok)}, seed=0), folder)
    save_tokenizer(tok, folder)


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    """The model repos' files, built once: the tiny LLaVA, the tiny judge, and MiniLM standing in for the encoder."""
    from paperflow.core.lm.encoders import minilm_folder

    root = tmp_path_factory.mktemp("snapshots")
    save_tiny_llava(root / "vlm")
    save_tiny_judge(root / "judge")
    shutil.copytree(minilm_folder(), root / "encoder")
    return {"org/tiny-llava": root / "vlm", "org/tiny-judge": root / "judge", "org/encoder": root / "encoder"}


@pytest.fixture
def hub(tmp_path, monkeypatch, snapshots):
    """download_pretrained replaced by a fake Hub: a dataset repo writes the fixture's parquet files matching the
    patterns, a model repo copies its snapshot. Returns (calls, cache)."""

    hub = install(monkeypatch, FakeHub(snapshots, dataset=hub_files()))
    return hub.calls, tmp_path / "cache"


def test_benchmark_downloads_fetch_only_their_files_at_the_pin_and_render_the_codes_questions(hub, tmp_path):
    calls, cache = hub
    rows = {
        name: paper.download_benchmark(name, b, str(cache), str(tmp_path / f"{name}.parquet"))
        for name, b in BENCHES.items()
    }
    written = {c["name"]: c["written"] for c in calls}
    assert all(c["revision"] == SHA and c["repo_type"] == "dataset" for c in calls)
    assert written["org/sqa"] == ["data/test-00000-of-00001-abc.parquet"]
    assert written["org/mmmu"] == ["Art/validation-00000-of-00001.parquet", "Math/validation-00000-of-00001.parquet"]
    # ScienceQA: the row without an image is skipped; choices rendered as the code renders them
    sqa, meta = read_frame(tmp_path / "ScienceQA.parquet")
    assert meta == {"benchmark": "ScienceQA", "hub": "org/sqa", "revision": SHA, "kind": "multi_choice"}
    assert list(sqa["idx"]) == [0, 2, 3] and list(sqa["gt"]) == ["1", "0", "1"]
    assert sqa["question"][0] == (
        "Which is a cat?\n(0): dog\n(1): cat\n\nThis is a single choice question, answer only with choice number in 0, 1."
    )
    assert sqa["image"][0] == png(0)
    # MMMU: two images or an open question are skipped; idx = subject * per_subject + row; letter -> index
    mmmu = read_frame(tmp_path / "MMMU.parquet")[0]
    assert list(mmmu["idx"]) == [0, 3, 4, 7] and list(mmmu["gt"]) == ["1", "2", "1", "2"]
    assert list(mmmu["group"]) == ["Art", "Art", "Math", "Math"]
    assert mmmu["question"][1].endswith(
        "(2): z\n\nThis is a single choice question, answer only with choice number in 0, 1, 2."
    )
    # free-form: LLaVA-Bench's reference is gpt_answer; MM-Vet's question carries the code's note
    llava, mmvet = (read_frame(tmp_path / f"{n}.parquet")[0] for n in ("LLaVABench", "MMVet"))
    assert list(llava["gt"]) == ["A cat on a mat.", "Red."] and set(llava["kind"]) == {"free_form"}
    assert mmvet["question"][0] == "How many cats?" + bm.MMVET_NOTE
    assert rows == {"ScienceQA": 3, "MMMU": 4, "LLaVABench": 2, "MMVet": 1}
    with pytest.raises(ValueError, match=r"columns \['answer'\] missing"):
        bm.read_mmvet(tmp_path / "cache" / "datasets" / "org--llava-bench" / SHA, {"files": ["llava/data/*.parquet"]})


def test_an_unpinned_download_is_refused_with_the_pin_command_named(hub, tmp_path, monkeypatch):
    from paperflow.core import download

    calls, cache = hub
    monkeypatch.setattr(download, "read_lock_revisions", lambda slug, root=None: {})  # whatever the checkout holds
    bench = {**BENCHES["MMVet"], "revision": None}
    with pytest.raises(
        UnpinnedDownload, match=r"benchmarks\.MMVet\.revision .*dataset:org/mmvet.*`paperflow pin doubt`"
    ):
        paper.download_benchmark("MMVet", bench, str(cache), str(tmp_path / "x.parquet"))
    with pytest.raises(UnpinnedDownload, match=r"encoder\.revision .*`paperflow pin doubt`"):
        download_model(
            {**ENCODER_SPEC, "revision": None},
            slug="doubt",
            key="encoder.revision",
            cache=str(cache),
            out=str(tmp_path / "e.json"),
        )
    with pytest.raises(ConfigError, match="not a pinned revision"):
        download_model(
            {**VLM_SPEC, "revision": "main"},
            slug="doubt",
            key="vlms.x.revision",
            cache=str(cache),
            out=str(tmp_path / "v.json"),
        )
    assert calls == []  # nothing was fetched


def test_answer_mapping_and_labels_follow_the_code_official_and_strict():
    q = bm.render_choices("Q?", ["red", "blue", "green"])
    got = bm.map_answers(["1", "The answer is (2).", "no digit", "7 is out of range", "2 and 0"], q)
    assert got == [
        "The answer of this question is blue.",
        "The answer of this question is green.",
        "no digit",
        "7 is out of range",
        "The answer of this question is green.",  # the first digit anywhere
    ]
    assert bm.label_multi_choice("10", 0) == (True, False)  # the code's substring test: "0" in "10"
    assert bm.label_multi_choice("(1)", 1) == (True, True) and bm.label_multi_choice("0", 1) == (False, False)
    assert bm.label_judge("Incorrect") == (True, False)  # the code counts any 'c' as correct
    assert bm.label_judge("Correct.") == (True, True) and bm.label_judge("Wrong") == (False, False)
    assert bm.oub_prompt("Q?", "{cat, dog}") == "Q?" + bm.BRIDGE + "{cat, dog}"
    assert bm.BRIDGE.endswith("\nImage Description:")


def test_the_paper_path_runs_end_to_end_on_a_tiny_llava_on_the_cpu(hub, tmp_path):
    from paperflow.core.report import publish
    from paperflow.doubt import scores
    from paperflow.doubt.paper_report import build_report

    _, cache = hub
    vlm_json, judge_json, enc_json = (str(tmp_path / f"{k}.json") for k in ("vlm", "judge", "enc"))
    download_model(VLM_SPEC, slug="doubt", key="vlms.tiny.revision", cache=str(cache), out=vlm_json)
    download_model(JUDGE_SPEC, slug="doubt", key="judge.revision", cache=str(cache), out=judge_json)
    download_model(ENCODER_SPEC, slug="doubt", key="encoder.revision", cache=str(cache), out=enc_json)
    labels, score_files = {}, {}
    for name, limit in (("ScienceQA", 2), ("LLaVABench", 1)):
        raw, items = str(tmp_path / f"raw_{name}.parquet"), str(tmp_path / f"items_{name}.parquet")
        paper.download_benchmark(name, BENCHES[name], str(cache), raw)
        assert paper.preprocess(raw, limit, items) == limit
        assert "gt" not in read_frame(items)[0].columns  # the sampling job never sees the ground truth
        samples = paper.sample("tiny", vlm_json, VLM_SPEC, items, SAMPLING, seed=0)
        assert len(samples) == limit and all(len(a) == 3 for s in ("A", "B") for a in samples[s])
        assert all(isinstance(x, str) for s in ("A", "B") for row in samples[s] for x in row)
        if name == "ScienceQA":  # seeded
            pd.testing.assert_frame_equal(samples, paper.sample("tiny", vlm_json, VLM_SPEC, items, SAMPLING, seed=0))
        sp = str(tmp_path / f"samples_{name}.parquet")
        samples.to_parquet(sp)
        if name == "ScienceQA":
            lab = paper.label_multi_choice(raw, sp)
            gt = read_frame(raw)[0].set_index("idx")["gt"]
            assert list(lab["correct_official"]) == [gt[i] in a for i, a in zip(samples["idx"], samples["ans0"])]
        else:
            lab = paper.judge(judge_json, JUDGE_SPEC, raw, sp, seed=0)
            assert list(lab["correct_official"]) == [bm.label_judge(r)[0] for r in lab["reply"]]
        lp = str(tmp_path / f"labels_{name}.parquet")
        lab.to_parquet(lp)
        emb = paper.embed(enc_json, ENCODER_SPEC, items, sp)
        ep = str(tmp_path / f"emb_{name}.parquet")
        emb.to_parquet(ep)
        texts = paper.answer_texts(read_frame(items)[0], samples)
        assert set(emb["answer"]) == {a for s in ("A", "B") for row in texts[s] for a in row}
        scoring = {"ns": [2, 3], "reps": 2}
        for method in ("doubt", "se_exact"):
            frame = paper.score(method, items, sp, ep, scoring, seed=0, chunk=1)  # blocks of one item
            path = str(tmp_path / f"scores_{name}_{method}.parquet")
            frame.to_parquet(path)
            score_files[("tiny", name, 0, method)] = path
            if method == "doubt":  # the score is -(0.5 Rbar(A) + 0.5 Rbar(B)) of the sets' embeddings, per item
                vec = dict(zip(emb["answer"], emb["vector"]))
                full = frame[frame["n"] == 3].sort_values("item")
                for i in range(limit):
                    r = [scores.rbar(np.stack([vec[a] for a in texts[s][i]])) for s in ("A", "B")]
                    assert full["score"].iloc[i] == pytest.approx(-(0.5 * r[0] + 0.5 * r[1]), abs=1e-9)
                    assert full["flag"].iloc[i] == float(0.5 * r[0] + 0.5 * r[1] <= 0.48)
        labels[("tiny", name, 0)] = lp
    metrics = paper.evaluate(labels, score_files)
    assert len(metrics) == 2 * 2 * 2 * 2  # benchmarks x methods x n x label modes
    assert set(metrics["benchmark"]) == {"ScienceQA", "LLaVABench"}
    assert metrics[metrics["method"] == "se_exact"]["detection_accuracy"].between(0, 1).all()
    outputs = {
        k: str(tmp_path / "report" / v)
        for k, v in {
            "report": "report.md",
            "metrics": "metrics.json",
            "table_detectors": "t.csv",
            "figure_auroc": "a.png",
            "metrics_table": "metrics.parquet",
        }.items()
    }
    params = {"seeds": [0], "sampling": SAMPLING, "scale": "paper"}
    claims = load_paper_config("doubt", "paper")["claims"]
    doc = publish(build_report(metrics, params), outputs, paper="doubt", scale="paper", claims=claims)
    (claim,) = doc["claims"]  # DOUBT's AUROC above chance, pooled over the (MLLM, benchmark) pairs
    assert claim["id"] == "paper_doubt_auroc_above_chance" and not claim["gated"] and claim["n_units"] == 2
    table = pd.read_parquet(outputs["metrics_table"])
    assert set(table["unit"]) == {"tiny/ScienceQA", "tiny/LLaVABench"} and set(table["method"]) == {"doubt", "se_exact"}


def test_evaluate_ranks_wrong_answers_as_positives_under_each_label_mode(tmp_path):
    labels = pd.DataFrame(
        {
            "idx": [0, 1, 2, 3],
            "reply": None,
            "correct_official": [True, False, True, False],
            "correct_strict": [True, True, True, False],
        }
    )
    labels.to_parquet(tmp_path / "labels.parquet")
    table = pd.DataFrame(
        {"seed": 0, "n": 3, "rep": 0, "item": [3, 2, 1, 0], "score": [-0.2, -0.8, -0.1, -0.9], "flag": [1.0, 0, 1, 0]}
    )  # hallucination scores (higher = more likely wrong), in another row order than the labels
    table.to_parquet(tmp_path / "doubt.parquet")
    got = paper.evaluate(
        {("m", "b", 0): str(tmp_path / "labels.parquet")}, {("m", "b", 0, "doubt"): str(tmp_path / "doubt.parquet")}
    )
    got = got.set_index("label_mode")
    # official: wrong items 1 and 3 hold the two highest scores and are the two flagged
    assert got.loc["official", "auroc"] == 1.0 and got.loc["official", "detection_accuracy"] == 1.0
    # strict: only item 3 is wrong; it outranks two of the three right ones; item 1 is flagged but right
    assert got.loc["strict", "auroc"] == pytest.approx(2 / 3) and got.loc["strict", "detection_accuracy"] == 0.75
    assert got.loc["strict", "wrong_rate"] == 0.25 and (got["items"] == 4).all()


def test_a_cuda_device_without_a_gpu_fails_naming_the_key(hub, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    _, cache = hub
    vlm_json = str(tmp_path / "vlm.json")
    download_model(VLM_SPEC, slug="doubt", key="vlms.tiny.revision", cache=str(cache), out=vlm_json)
    with pytest.raises(ConfigError, match=r"vlms\.tiny\.device = 'cuda'"):
        paper.sample("tiny", vlm_json, {**VLM_SPEC, "device": "cuda"}, "unused", SAMPLING, seed=0)


def test_a_qwen2_vl_snapshot_without_torchvision_is_refused_by_name(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchvision" else real(name, *a))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    with pytest.raises(RuntimeError, match=r"org/qwen \(model_type qwen2_vl\).*torchvision"):
        paper.require_processor_deps(str(tmp_path), "org/qwen")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava"}))
    paper.require_processor_deps(str(tmp_path), "org/llava")  # LLaVA's processor needs none


def test_the_paper_config_resolves_and_bad_paper_keys_are_named(repo_copy):
    cfg = load_paper_config("doubt", "paper")
    assert cfg["sampling"]["top_p"] == 0.99 and cfg["sampling"]["max_new_tokens"] == 128
    assert all(v["device"] == "cuda" for v in cfg["vlms"].values()) and cfg["judge"]["device"] == "cuda"
    from paperflow.doubt.settings import check

    without_nli = {k: v for k, v in cfg.items() if k != "nli"}
    with pytest.raises(ConfigError, match=r"methods \['se_plain', 'se_oub', 'oub_se'\] cluster by entailment"):
        check(without_nli, "doubt.yaml")
    check({**without_nli, "methods": ["doubt", "se_exact"]}, "doubt.yaml")  # no SE by entailment: no NLI needed
    path = repo_copy / "config" / "doubt.yaml"
    text = path.read_text()
    for old, new, message in (
        (
            "      max_memory_per_gpu: 70GiB",
            "      no_memory_per_gpu: 70GiB",
            r"no_memory_per_gpu",
        ),  # a misspelt key (schema)
        ("      max_memory_per_gpu: 70GiB", "      #", r"vlms\.Qwen2-VL-72B-Instruct\.gpus = 4 .*max_memory_per_gpu"),
        ("    MMVet:\n", "    POPE:\n", r"benchmarks \['POPE'\] have no reader"),
        ("revision: 895c3a49bc3fa70a340399125c650a463535e71c", "revision: main", "revision"),
    ):
        assert old in text
        path.write_text(text.replace(old, new))
        with pytest.raises(ConfigError, match=message):
            load_paper_config("doubt", "paper", repo_copy)
    path.write_text(text)


def test_paper_scale_dry_run_puts_gpus_on_sampling_judging_embedding_entailment_and_rephrasing_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[doubt]")
    cfg = load_paper_config("doubt", "paper")
    v, s = len(cfg["vlms"]), len(cfg["seeds"])
    kinds = [bm.KIND_OF[b] for b in cfg["benchmarks"]]
    mc, ff = kinds.count(bm.MULTI_CHOICE), kinds.count(bm.FREE_FORM)
    counts = dict(re.findall(r"^(doubt_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts == {
        "doubt_download_model": str(v),
        "doubt_download_judge": "1",
        "doubt_download_encoder": "1",
        "doubt_download": str(mc + ff),
        "doubt_preprocess": str(mc + ff),
        "doubt_sample": str(v * (mc + ff) * s),
        "doubt_label": str(v * mc * s),
        "doubt_judge": str(v * ff * s),
        "doubt_embed": str(v * (mc + ff) * s),
        "doubt_download_nli": "1",
        "doubt_entail": str(v * (mc + ff) * s),
        "doubt_rephrase": str((mc + ff) * s),  # once per benchmark and seed, shared by the MLLMs
        "doubt_sample_perturbed": str(v * (mc + ff) * s),
        "doubt_entail_perturbed": str(v * ff * s),
        "doubt_score": str(v * (mc + ff) * s * len(cfg["methods"])),
        "doubt_evaluate": "1",
        "doubt_report": "1",
    }
    gpus, jobs = {}, parse_dry_run(proc.stdout)
    for job in jobs:
        gpus.setdefault(job.rule, set()).add(job.gpus)
    heavy = ("doubt_judge", "doubt_embed", "doubt_entail", "doubt_rephrase", "doubt_entail_perturbed")
    assert all(gpus[r] == {1} for r in heavy)
    assert all(g == {0} for r, g in gpus.items() if r not in (*heavy, "doubt_sample", "doubt_sample_perturbed"))
    # sampling (plain / OUB sets, and VL-Uncertainty's perturbed prompts): each MLLM's own GPU count (4 for the 72B
    # model), on one node
    for rule in ("doubt_sample", "doubt_sample_perturbed"):
        sampled = [j for j in jobs if j.rule == rule]
        assert {j.wildcards["vlm"]: j.gpus for j in sampled} == {n: e.get("gpus", 1) for n, e in cfg["vlms"].items()}
        assert max(j.gpus for j in sampled) == 4 and all(j.resources["nodes"] == "1" for j in sampled)
    assert json.loads(json.dumps(sorted(gpus)))  # every rule appeared


# ---- several GPUs per MLLM, the remaining native model types, semantic entropy by entailment --------------------


def test_a_vlm_on_several_gpus_is_sharded_with_device_map_and_max_memory_per_gpu():
    big = {"device": "cuda", "gpus": 4, "max_memory_per_gpu": "70GiB"}
    assert paper.placement({"device": "cuda"}, "vlms.small", visible=0) == {}  # one GPU: moved with .to(device)
    assert paper.placement(big, "vlms.big", visible=8) == {
        "device_map": "auto",
        "max_memory": {0: "70GiB", 1: "70GiB", 2: "70GiB", 3: "70GiB", "cpu": "0GiB"},
    }
    with pytest.raises(ConfigError, match=r"vlms\.big\.gpus = 4 but this job sees 2 CUDA device"):
        paper.placement(big, "vlms.big", visible=2)
    with pytest.raises(ConfigError, match=r"vlms\.big\.max_memory_per_gpu is missing"):
        paper.placement({"device": "cuda", "gpus": 2}, "vlms.big", visible=2)
    with pytest.raises(ConfigError, match=r"vlms\.big\.device must be 'cuda'"):
        paper.placement({**big, "device": "cpu"}, "vlms.big", visible=4)
    paper.check_device_map({"vision_tower": 0, "language_model.layers.0": 1, "lm_head": "cuda:3"}, "vlms.big")
    with pytest.raises(RuntimeError, match=r"vlms\.big: .*placed on \['cpu', 'disk'\].*max_memory_per_gpu"):
        paper.check_device_map({"a": 0, "b": "cpu", "c": "disk"}, "vlms.big")


def save_tiny_llava_next(folder: Path) -> None:
    """A tiny LLaVA-NeXT (CLIP tower, anyres grid pinpoints, Llama) and its processor (PIL image backend)."""
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextProcessor,
    )
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    tok, grid = word_tokenizer(), [[28, 28], [28, 56]]
    cfg = LlavaNextConfig(
        vision_config=CLIPVisionConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        ),
        text_config=LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=512,
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=grid,
        vision_feature_layer=-2,
        image_seq_length=4,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlavaNextForConditionalGeneration(cfg).save_pretrained(folder)
    images = LlavaNextImageProcessorPil(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, image_grid_pinpoints=grid
    )
    LlavaNextProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=14,
        vision_feature_select_strategy="default",
        chat_template=CHAT,
        num_additional_image_tokens=1,
    ).save_pretrained(folder)


def test_a_tiny_llava_next_loads_and_samples_through_the_vlm_sampler(tmp_path):
    from PIL import Image

    save_tiny_llava_next(tmp_path / "next")
    info = {"hub": "org/tiny-next", "revision": SHA, "folder": str(tmp_path / "next")}
    vlm = paper.VLM(info, {**VLM_SPEC, "batch_size": 2}, device=__import__("torch").device("cpu"), key="vlms.next")
    assert type(vlm.model).__name__ == "LlavaNextForConditionalGeneration"
    image = Image.open(io.BytesIO(png(0))).convert("RGB")
    __import__("torch").manual_seed(0)
    got = vlm.generate("the answer", image, 3, temperature=0.5, max_new_tokens=3, top_k=10, top_p=0.99)
    assert len(got) == 3 and all(isinstance(a, str) for a in got)


def test_tiny_qwen2_vl_and_internvl_models_load_natively_and_sample_on_the_cpu(tmp_path):
    """Their processors need torchvision (absent from this venv: refused by name above); the models load through
    the sampler's loader and generate from hand-built inputs (the image placeholder tokens the processor writes)."""
    import torch
    from PIL import Image
    from transformers import (
        InternVLConfig,
        InternVLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = word_tokenizer()
    special = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<IMG_CONTEXT>"]
    tok.add_tokens(special, special_tokens=True)
    sid = {t: tok.convert_tokens_to_ids(t) for t in special}
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(
        Qwen2VLConfig(
            text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
            vision_config=dict(
                depth=1,
                embed_dim=16,
                hidden_size=32,
                num_heads=2,
                mlp_ratio=2,
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                in_chans=3,
            ),
            image_token_id=sid["<|image_pad|>"],
            video_token_id=sid["<|video_pad|>"],
            vision_start_token_id=sid["<|vision_start|>"],
            vision_end_token_id=sid["<|vision_end|>"],
        )
    ).save_pretrained(tmp_path / "qwen2_vl")
    InternVLForConditionalGeneration(
        InternVLConfig(
            vision_config=dict(
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=[28, 28],
                patch_size=[14, 14],
            ),
            text_config={**text, "model_type": "qwen2"},
            image_token_id=sid["<IMG_CONTEXT>"],
            downsample_ratio=0.5,
        )
    ).save_pretrained(tmp_path / "internvl")
    spec, cpu = {"dtype": "float32", "device": "cpu"}, torch.device("cpu")
    prompt = tok("USER: the answer", add_special_tokens=False)["input_ids"]
    image = Image.open(io.BytesIO(png(0))).convert("RGB")
    pixels = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=56 * 56)(images=[image], return_tensors="pt")
    tokens = int(pixels["image_grid_thw"].prod()) // 4  # merged 2 x 2 patches
    inputs = {
        "qwen2_vl": {
            "input_ids": [sid["<|vision_start|>"]] + [sid["<|image_pad|>"]] * tokens + [sid["<|vision_end|>"]] + prompt,
            "pixel_values": pixels["pixel_values"],
            "image_grid_thw": pixels["image_grid_thw"],
        },
        "internvl": {"input_ids": [sid["<IMG_CONTEXT>"]] + prompt, "pixel_values": torch.randn(1, 3, 28, 28)},
    }
    for kind, inp in inputs.items():
        model = paper.load_vlm_model(str(tmp_path / kind), spec, f"vlms.{kind}", cpu)
        assert model.config.model_type == kind and not model.training
        ids = torch.tensor([inp.pop("input_ids")])
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            **inp,
            do_sample=True,
            temperature=0.5,
            top_k=10,
            max_new_tokens=3,
        )
        assert out.shape == (1, ids.shape[1] + 3)


def test_entailment_clusters_follow_hand_made_decisions():
    from paperflow.doubt import entailment, scores

    # a fake NLI: "cat" and "a cat" entail each other, "a cat" entails "an animal" but not back, "dog" nothing
    entails = {("cat", "a cat"), ("a cat", "cat"), ("a cat", "an animal")}
    asked = []

    def judge(pairs):
        asked.extend(pairs)
        return [p in entails for p in pairs]

    answers = ["a cat", "dog", "cat", "an animal", "cat", "dog"]
    got = entailment.clusters(answers, judge)
    assert got == [0, 1, 0, 2, 0, 1]  # one-way entailment is not the same meaning
    assert len(asked) == len(set(asked)) == 4 * 3  # each ordered pair of the 4 distinct strings once
    assert scores.semantic_entropy(got) == pytest.approx(
        -(0.5 * np.log2(0.5) + 2 / 6 * np.log2(2 / 6) + 1 / 6 * np.log2(1 / 6))
    )
    same = entailment.equivalence(["a cat", "cat", "dog"], judge)
    assert same.tolist() == [[True, True, False], [True, True, False], [False, False, True]]
    assert entailment.entailment_label({0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}) == 2
    with pytest.raises(ValueError, match="no single 'entailment' class"):
        entailment.entailment_label({0: "LABEL_0", 1: "LABEL_1"})


def test_with_string_equality_as_entailment_semantic_entropy_equals_the_exact_string_variant():
    from paperflow.doubt import entailment, scores

    rng = np.random.default_rng(0)
    words = ["red", "blue", "it is red", "green"]
    for _ in range(20):
        answers = [words[k] for k in rng.integers(0, 4, size=10)]
        se = scores.semantic_entropy(entailment.clusters(answers, lambda pairs: [p == h for p, h in pairs]))
        assert se == pytest.approx(scores.semantic_entropy(answers), abs=1e-12)


def save_tiny_nli(folder: Path, verdict: int) -> None:
    """A tiny DeBERTa MNLI-style classifier (CONTRADICTION, NEUTRAL, ENTAILMENT) whose head's bias makes class
    `verdict` win on every pair, and its tokenizer."""
    import torch
    from transformers import DebertaConfig, DebertaForSequenceClassification

    from paperflow.core.lm.tokenizer import save_tokenizer

    tok = word_tokenizer()
    cfg = DebertaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=128,
        num_labels=3,
        pad_token_id=tok.pad_token_id,
        id2label={0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"},
        label2id={"CONTRADICTION": 0, "NEUTRAL": 1, "ENTAILMENT": 2},
    )
    torch.manual_seed(0)
    model = DebertaForSequenceClassification(cfg)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.full((3,), -50.0).index_fill_(0, torch.tensor([verdict]), 50.0))
    model.save_pretrained(folder)
    save_tokenizer(tok, folder)


def test_a_tiny_nli_model_runs_the_entailment_rule_and_semantic_entropy_uses_its_clusters(tmp_path):
    from paperflow.core.io import write_frame
    from paperflow.doubt import entailment, scores

    items = pd.DataFrame({"idx": [3, 7], "question": ["What is the cat ?", "Which colour ?"], "kind": bm.FREE_FORM})
    write_frame(tmp_path / "items.parquet", items, {})
    samples = pd.DataFrame(
        {
            "idx": [3, 7],
            "ans0": ["cat", "red"],
            "A": [["cat", "a cat", "dog", "cat"], ["red", "red", "red", "red"]],
            "B": [["dog", "dog", "cat", "a dog"], ["blue", "red", "the answer is red", "red"]],
        }
    )
    samples.to_parquet(tmp_path / "samples.parquet")
    strings = sorted({a for s in ("A", "B") for row in samples[s] for a in row})
    emb = pd.DataFrame({"answer": strings, "vector": list(np.random.default_rng(0).normal(size=(len(strings), 8)))})
    emb.to_parquet(tmp_path / "emb.parquet")
    scoring, spec = {"ns": [3, 4], "reps": 2}, {"device": "cpu", "batch_size": 4, "condition_on_question": True}
    exact = paper.score(
        "se_exact",
        str(tmp_path / "items.parquet"),
        str(tmp_path / "samples.parquet"),
        str(tmp_path / "emb.parquet"),
        scoring,
        seed=0,
    )
    for verdict, name in ((2, "entails"), (0, "contradicts")):
        save_tiny_nli(tmp_path / name, verdict)
        nli_json = tmp_path / f"{name}.json"
        nli_json.write_text(json.dumps({"hub": "org/nli", "revision": SHA, "folder": str(tmp_path / name)}))
        judged = paper.entail(str(nli_json), spec, str(tmp_path / "items.parquet"), str(tmp_path / "samples.parquet"))
        assert list(judged["idx"]) == [3, 7]
        model, tok = entailment.load_nli(str(tmp_path / name), "cpu")
        for _, row in judged.iterrows():  # the stored matrix is the model's own verdicts, both ways
            k = len(row["answers"])
            judge = entailment.NLIJudge(
                model, tok, "cpu", 4, prefix=items.set_index("idx")["question"][row["idx"]] + " "
            )
            assert np.array_equal(np.reshape(row["same"], (k, k)), entailment.equivalence(list(row["answers"]), judge))
        path = tmp_path / f"entail_{name}.parquet"
        judged.to_parquet(path)
        se = paper.score(
            "se_plain",
            str(tmp_path / "items.parquet"),
            str(tmp_path / "samples.parquet"),
            str(tmp_path / "emb.parquet"),
            scoring,
            seed=0,
            entail_path=str(path),
        )
        if verdict == 2:  # every answer entails every other: one cluster, zero entropy, nothing flagged
            assert (se["score"] == 0).all() and (se["flag"] == 0).all()
        else:  # nothing entails: the clusters are the exact strings
            key = ["n", "rep", "item"]
            got, want = se.sort_values(key), exact.sort_values(key)
            assert got[key].to_numpy().tolist() == want[key].to_numpy().tolist()
            np.testing.assert_allclose(got["score"].to_numpy(), want["score"].to_numpy(), atol=1e-12)
            assert 0 < got["score"].max()  # the check can fail: the sets are not all uniform
    oub = paper.score(
        "oub_se",
        str(tmp_path / "items.parquet"),
        str(tmp_path / "samples.parquet"),
        str(tmp_path / "emb.parquet"),
        {"ns": [4], "reps": 1},
        seed=0,
        entail_path=str(path),
    )
    expected = [np.mean([scores.semantic_entropy(list(samples[s][i])) for s in ("A", "B")]) for i in range(2)]
    np.testing.assert_allclose(oub.sort_values("item")["score"].to_numpy(), expected, atol=1e-12)
    with pytest.raises(ValueError, match="clusters by entailment"):
        paper.score(
            "se_plain",
            str(tmp_path / "items.parquet"),
            str(tmp_path / "samples.parquet"),
            str(tmp_path / "emb.parquet"),
            scoring,
            seed=0,
        )


def test_internvl2_tiles_follow_the_codes_load_image():
    from PIL import Image

    assert paper.closest_grid(3.0, 60, 20, 28, 4) == (3, 1)
    assert paper.closest_grid(1.0, 100, 100, 28, 4) == (2, 2)  # a tie with (1, 1): the large image takes the grid
    assert paper.closest_grid(1.0, 20, 20, 28, 4) == (1, 1)
    colour = (200, 30, 90)
    wide = paper.internvl_tiles(Image.new("RGB", (60, 20), colour), size=28, max_tiles=4)
    assert tuple(wide.shape) == (4, 3, 28, 28) and str(wide.dtype) == "torch.float32"  # 3 tiles + the thumbnail
    want = (np.array(colour) / 255.0 - np.array(paper.IMAGENET_MEAN)) / np.array(paper.IMAGENET_STD)
    np.testing.assert_allclose(wide.numpy()[:, :, 5, 7].T, np.repeat(want[:, None], 4, axis=1), atol=1e-6)
    assert tuple(paper.internvl_tiles(Image.new("RGB", (20, 20)), size=28, max_tiles=4).shape) == (1, 3, 28, 28)


def test_internvl2_samples_one_chat_call_per_answer_with_the_codes_generation_config(monkeypatch, tmp_path):
    import importlib.util

    import torch
    from PIL import Image

    calls = []

    class FakeChat:  # InternVL2's remote model: chat(tokenizer, pixel_values, question, generation_config)
        def chat(self, tokenizer, pixel_values, question, generation_config):
            calls.append((tokenizer, tuple(pixel_values.shape), pixel_values.dtype, question, generation_config))
            return f" answer {len(calls)} "

    spec = {"dtype": "bfloat16", "max_tiles": 4, "image_size": 28}
    chat = paper.InternVLChat(FakeChat(), "tok", spec, torch.device("cpu"))
    got = chat.generate("Q?", Image.new("RGB", (60, 20)), 2, 0.5, 128, top_k=10, top_p=0.99, num_beams=1)
    assert got == ["answer 1", "answer 2"]
    config = {"max_new_tokens": 128, "do_sample": True, "temperature": 0.5, "top_k": 10, "top_p": 0.99, "num_beams": 1}
    assert calls == [("tok", (4, 3, 28, 28), torch.bfloat16, "Q?", config)] * 2
    with pytest.raises(ConfigError, match=r"vlms\.x\.backend = 'remote'; choose one of \['native', 'internvl_chat'\]"):
        paper.load_vlm({"hub": "o/x", "revision": SHA, "folder": "."}, {"backend": "remote"}, "cpu", "vlms.x")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "timm" else real(name, *a))
    with pytest.raises(RuntimeError, match=r"vlms\.InternVL2-8B \(o/x\): its remote modeling code imports \[.*'timm'"):
        paper.load_vlm(
            {"hub": "o/x", "revision": SHA, "folder": str(tmp_path)},
            {"backend": "internvl_chat"},
            "cpu",
            "vlms.InternVL2-8B",
        )


# ---- VL-Uncertainty (Ruiyang-061X/VL-Uncertainty at 793f911): perturbed prompts, their answers, entropy --------

VLU = {
    "blur_radii": {"ScienceQA": [0.1, 0.5, 1.0], "LLaVABench": [0.6, 1.0, 1.4]},
    "rephrase_temperatures": [0.1, 0.3, 0.5],
    "instruction": "Given the input question: '{question}', rephrase it.",
    "max_new_tokens": 3,
    "temperature": {"ScienceQA": {"default": 0.5, "tiny": 0.7}, "LLaVABench": {"default": 1.0}},
}


def box_radius(radius: float, passes: int = 3) -> float:
    """The fractional box radius per pass of PIL's GaussianBlur (an extended box blur whose three passes have
    variance radius**2; Gwosdek et al. 2011, Pillow's BoxBlur.c)."""
    s2 = radius * radius / passes
    lo = np.floor((np.sqrt(12 * s2 + 1) - 1) / 2)
    return float(lo + (2 * lo + 1) * (lo * (lo + 1) - 3 * s2) / (6 * (s2 - (lo + 1) ** 2)))


def box_kernel(r: float) -> np.ndarray:
    lo, ww = int(np.floor(r)), 1 / (2 * r + 1)
    return np.array([(r - lo) * ww] + [ww] * (2 * lo + 1) + [(r - lo) * ww])


def test_blur_levels_are_pils_gaussian_blur_at_the_official_radii_on_a_hand_made_image():
    from PIL import Image

    from paperflow.doubt import vl_uncertainty as vlu

    cfg = load_paper_config("doubt", "paper")["vl_uncertainty"]
    radii = sorted({r for levels in cfg["blur_radii"].values() for r in levels})
    assert len(cfg["rephrase_temperatures"]) == 5 and all(len(v) == 5 for v in cfg["blur_radii"].values())
    a = np.zeros((15, 17, 3), np.uint8)
    a[7, 8] = 255  # an impulse, a coloured dot and a grey band touching the border
    a[2, 3] = (10, 200, 90)
    a[:, 14:] = 120
    image = Image.fromarray(a)
    spreads = []
    for r in radii:
        k = box_kernel(box_radius(r))
        offsets = np.arange(len(k)) - len(k) // 2
        assert len(k) == 3 and k.sum() == pytest.approx(1)  # every official radius: 3 taps per pass
        assert 3 * (k * offsets**2).sum() == pytest.approx(r * r, abs=1e-9)  # variance of the 3 passes = radius^2
        ref = a.astype(float)
        for axis in (1, 0):  # three passes per axis, edge pixels repeated
            for _ in range(3):
                pad = [(0, 0)] * 3
                pad[axis] = (1, 1)
                padded = np.pad(ref, pad, mode="edge")
                ref = sum(w * np.take(padded, range(i, i + ref.shape[axis]), axis=axis) for i, w in enumerate(k))
        got = vlu.blur(image, r)
        assert got.size == image.size and got.mode == "RGB"
        assert got.tobytes() == vlu.blur(image, r).tobytes()  # deterministic
        assert np.abs(np.asarray(got, dtype=float) - ref).max() <= 2.5  # PIL rounds to 8 bits after each pass
        spreads.append(255 - int(np.asarray(got)[7, 8, 0]))
    assert spreads == sorted(spreads) and spreads[0] < spreads[-1]  # more blur, a flatter impulse
    flat = Image.new("RGB", (9, 9), (30, 60, 90))
    assert vlu.blur(flat, 1.4).tobytes() == flat.tobytes()


def test_rephrasings_follow_the_codes_requests_and_keep_the_options(hub, tmp_path, monkeypatch):
    from paperflow.core.io import write_frame
    from paperflow.doubt import vl_uncertainty as vlu

    _, cache = hub
    judge_json = str(tmp_path / "judge.json")
    download_model(JUDGE_SPEC, slug="doubt", key="judge.revision", cache=str(cache), out=judge_json)
    mc = bm.render_choices("Which is a cat?", ["dog", "cat"])
    items = pd.DataFrame({"idx": [4, 9], "question": [mc, "What colour is it?"], "kind": bm.MULTI_CHOICE})
    write_frame(tmp_path / "items.parquet", items, {})
    asked, real = [], paper.ChatLLM.reply

    def recording(self, user, temperature):
        asked.append((user, temperature))
        return real(self, user, temperature)

    monkeypatch.setattr(paper.ChatLLM, "reply", recording)
    got = vlu.rephrase(judge_json, JUDGE_SPEC, VLU, str(tmp_path / "items.parquet"), seed=0)
    # one request per item and temperature, in order, on the question's first line only
    assert asked == [("Given the input question: 'Which is a cat?', rephrase it.", t) for t in (0.1, 0.3, 0.5)] + [
        ("Given the input question: 'What colour is it?', rephrase it.", t) for t in (0.1, 0.3, 0.5)
    ]
    assert list(got["idx"]) == [4, 9] and all(len(r) == 3 for r in got["rephrased"])
    for reply, q in zip(got["rephrased"][0], got["questions"][0]):  # the options and the instruction stay
        assert (
            q
            == reply
            + "\n(0): dog\n(1): cat\n\nThis is a single choice question, answer only with choice number in 0, 1."
        )
    assert list(got["questions"][1]) == [r + "\n" for r in got["rephrased"][1]]  # merge_question's trailing newline
    again = vlu.rephrase(judge_json, JUDGE_SPEC, VLU, str(tmp_path / "items.parquet"), seed=0)
    assert again["rephrased"].tolist() == got["rephrased"].tolist()  # seeded
    assert vlu.merge("New?", "Old?\n(0): a\n(1): b") == "New?\n(0): a\n(1): b"


def test_vl_uncertainty_scores_hand_made_perturbed_answer_sets(tmp_path):
    from paperflow.core.io import write_frame
    from paperflow.doubt import vl_uncertainty as vlu

    q = bm.render_choices("Which one?", ["red", "blue", "green"])
    items = pd.DataFrame({"idx": [0, 1], "question": [q, q], "kind": bm.MULTI_CHOICE})
    write_frame(tmp_path / "mc.parquet", items, {})
    # item 0: choices 1, 1, 2 and two -1 (no integer; "10" is one integer, out of range); item 1: all choice 0
    perturbed = pd.DataFrame({"idx": [0, 1], "P": [["1", "It is (1).", "2", "10", "none"], ["0"] * 5]})
    perturbed.to_parquet(tmp_path / "mc_p.parquet")
    assert vlu.choice_clusters(perturbed["P"][0], 3) == [1, 1, 2, -1, -1]
    got = vlu.score(str(tmp_path / "mc.parquet"), str(tmp_path / "mc_p.parquet"), seed=3)
    u0 = -(2 * 0.4 * np.log2(0.4) + 0.2 * np.log2(0.2))  # counts (2, 2, 1) of 5
    assert got["score"].tolist() == pytest.approx([u0, 0.0], abs=1e-12)
    assert got["flag"].tolist() == [1.0, 0.0] and set(got["n"]) == {5} and set(got["rep"]) == {0}
    assert set(got["method"]) == {"vl_uncertainty"} and set(got["seed"]) == {3} and list(got["item"]) == [0, 1]
    # free-form: a hand-made equivalence; "kitty" matches "cat" but not "a cat", the first member of its cluster
    ff = pd.DataFrame({"idx": [5], "question": ["What is it?"], "kind": bm.FREE_FORM})
    write_frame(tmp_path / "ff.parquet", ff, {})
    pd.DataFrame({"idx": [5], "P": [["a cat", "cat", "dog", "a cat", "kitty"]]}).to_parquet(tmp_path / "ff_p.parquet")
    strings = ["a cat", "cat", "dog", "kitty"]
    same = np.eye(4, dtype=bool)
    same[0, 1] = same[1, 0] = same[1, 3] = same[3, 1] = True
    judged = pd.DataFrame({"idx": [5], "answers": [strings], "same": [same.ravel().tolist()]})
    judged.to_parquet(tmp_path / "ff_e.parquet")
    got = vlu.score(str(tmp_path / "ff.parquet"), str(tmp_path / "ff_p.parquet"), 0, str(tmp_path / "ff_e.parquet"))
    assert got["score"].iloc[0] == pytest.approx(-(0.6 * np.log2(0.6) + 2 * 0.2 * np.log2(0.2)), abs=1e-12)
    assert got["flag"].iloc[0] == 1.0  # clusters {a cat, cat, a cat}, {dog}, {kitty}: U = 1.371 >= 1
    with pytest.raises(ValueError, match="clusters by entailment"):
        vlu.score(str(tmp_path / "ff.parquet"), str(tmp_path / "ff_p.parquet"), 0)


def test_vl_uncertainty_runs_end_to_end_on_the_tiny_llava_and_joins_the_evaluation(hub, tmp_path):
    from paperflow.core.report import publish
    from paperflow.doubt import vl_uncertainty as vlu
    from paperflow.doubt.paper_report import build_report

    _, cache = hub
    vlm_json, judge_json = str(tmp_path / "vlm.json"), str(tmp_path / "judge.json")
    download_model(VLM_SPEC, slug="doubt", key="vlms.tiny.revision", cache=str(cache), out=vlm_json)
    download_model(JUDGE_SPEC, slug="doubt", key="judge.revision", cache=str(cache), out=judge_json)
    save_tiny_nli(tmp_path / "nli", 0)  # contradicts everything: the free-form clusters are the exact strings
    nli_json = tmp_path / "nli.json"
    nli_json.write_text(json.dumps({"hub": "org/nli", "revision": SHA, "folder": str(tmp_path / "nli")}))
    nli = {"device": "cpu", "batch_size": 8, "condition_on_question": True}
    labels, score_files = {}, {}
    for name in ("ScienceQA", "LLaVABench"):
        raw, items = str(tmp_path / f"raw_{name}.parquet"), str(tmp_path / f"items_{name}.parquet")
        paper.download_benchmark(name, BENCHES[name], str(cache), raw)
        paper.preprocess(raw, 2, items)
        prompts = vlu.rephrase(judge_json, JUDGE_SPEC, VLU, items, seed=0)
        pp = str(tmp_path / f"prompts_{name}.parquet")
        prompts.to_parquet(pp)
        perturbed = vlu.sample("tiny", name, vlm_json, VLM_SPEC, items, pp, VLU, seed=0)
        assert list(perturbed["idx"]) == list(read_frame(items)[0]["idx"])
        assert all(len(a) == 3 and all(isinstance(x, str) for x in a) for a in perturbed["P"])
        sp = str(tmp_path / f"perturbed_{name}.parquet")
        perturbed.to_parquet(sp)
        entail_path = None
        if name == "LLaVABench":
            judged = vlu.entail(str(nli_json), nli, items, sp)
            assert [sorted(set(a)) for a in perturbed["P"]] == [list(a) for a in judged["answers"]]
            entail_path = str(tmp_path / "entail.parquet")
            judged.to_parquet(entail_path)
        frame = vlu.score(items, sp, 0, entail_path)
        q = read_frame(items)[0]["question"]
        if name == "ScienceQA":
            want = [scores_se(vlu.choice_clusters(a, vlu.num_choices(x))) for a, x in zip(perturbed["P"], q)]
        else:
            want = [scores_se(list(a)) for a in perturbed["P"]]  # nothing entails: the exact strings
        np.testing.assert_allclose(frame["score"].to_numpy(), want, atol=1e-12)
        path = str(tmp_path / f"scores_{name}.parquet")
        frame.to_parquet(path)
        score_files[("tiny", name, 0, "vl_uncertainty")] = path
        lab = pd.DataFrame(
            {"idx": perturbed["idx"], "reply": None, "correct_official": [True, False], "correct_strict": [False, True]}
        )
        lp = str(tmp_path / f"labels_{name}.parquet")
        lab.to_parquet(lp)
        labels[("tiny", name, 0)] = lp
    # another MLLM's temperature and an unknown benchmark, by name
    assert vlu.temperature(VLU, "tiny", "ScienceQA") == 0.7 and vlu.temperature(VLU, "other", "ScienceQA") == 0.5
    with pytest.raises(ConfigError, match=r"vl_uncertainty\.blur_radii has no entry for the benchmark 'MMVet'"):
        vlu.radii(VLU, "MMVet")
    metrics = paper.evaluate(labels, score_files)
    assert len(metrics) == 2 * 2 and set(metrics["n"]) == {3} and metrics["full_set"].all()
    assert metrics["detection_accuracy"].between(0, 1).all()
    outputs = {
        k: str(tmp_path / "report" / v)
        for k, v in {
            "report": "report.md",
            "metrics": "metrics.json",
            "table_detectors": "t.csv",
            "figure_auroc": "a.png",
            "metrics_table": "metrics.parquet",
        }.items()
    }
    publish(
        build_report(metrics, {"seeds": [0], "sampling": SAMPLING, "scale": "paper"}),
        outputs,
        paper="doubt",
        scale="paper",
        claims=[],  # this run has no DOUBT arm: the report's text and table are what is checked here
    )
    text = Path(outputs["report"]).read_text()
    assert "vl_uncertainty" in text and "blurred-image" in text


def scores_se(clusters):
    from paperflow.doubt.scores import semantic_entropy

    return semantic_entropy(clusters)


def test_vl_uncertainty_config_errors_are_named():
    from paperflow.doubt.settings import check

    cfg = load_paper_config("doubt", "paper")
    vlu = cfg["vl_uncertainty"]
    cases = (
        (
            {**vlu, "blur_radii": {k: v for k, v in vlu["blur_radii"].items() if k != "MMMU"}},
            r"vl_uncertainty\.blur_radii has no entry for the benchmarks \['MMMU'\]",
        ),
        (
            {**vlu, "blur_radii": {**vlu["blur_radii"], "MMVet": [0.6, 0.8]}},
            r"blur_radii\.MMVet has 2 radii but rephrase_temperatures has 5",
        ),
        (
            {**vlu, "temperature": {**vlu["temperature"], "MMVet": {"default": 0.5, "gpt-4v": 1.0}}},
            r"names MLLMs \['gpt-4v'\] that are not in vlms",
        ),
    )
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            check({**cfg, "vl_uncertainty": bad}, "doubt.yaml")
    with pytest.raises(ConfigError, match=r"free-form benchmarks \['LLaVABench', 'MMVet'\] clusters by entailment"):
        check({**{k: v for k, v in cfg.items() if k != "nli"}, "methods": ["doubt", "vl_uncertainty"]}, "doubt.yaml")
    with pytest.raises(ConfigError, match="methods has vl_uncertainty but the key vl_uncertainty is missing"):
        check({k: v for k, v in cfg.items() if k != "vl_uncertainty"}, "doubt.yaml")
    smoke = load_paper_config("doubt", "smoke")
    with pytest.raises(ConfigError, match="vl_uncertainty runs at paper scale only"):
        check({**smoke, "methods": [*smoke["methods"], "vl_uncertainty"]}, "doubt.yaml")


# ---- long jobs resume (issue 43): each generation job journals its items and a rerun does only the rest ----------


class Killed(RuntimeError):
    """A job killed part way (raised by `Calls` at its call)."""


class Calls:
    """`owner.attr` wrapped: counts its calls, and the call number `kill_at` (when set) raises `Killed`."""

    def __init__(self, monkeypatch, owner, attr):
        real, self.n, self.kill_at = getattr(owner, attr), 0, None

        def wrapped(*args, **kwargs):
            self.n += 1
            if self.n == self.kill_at:
                raise Killed(f"{attr}: killed at call {self.n}")
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, attr, wrapped)

    def run(self, job, journal, kill_at=None):
        self.n, self.kill_at = 0, kill_at
        return job(journal)


# the unit call each job makes per item: (owner, attribute, calls per item)
UNITS = {
    "sample": (paper.VLM, "generate", 4),  # ans0, A, the object list, B
    "judge": (paper.ChatLLM, "reply", 1),
    "rephrase": (paper.ChatLLM, "reply", 3),  # one per rephrasing temperature
    "sample_perturbed": (paper.VLM, "generate", 3),  # one per perturbed prompt
    "entail": ("entailment", "equivalence", 1),
    "entail_perturbed": ("entailment", "equivalence", 1),
}


def resume_jobs(hub, tmp_path):
    """{case: the generation rule's function as a function of its journal path}, on the tiny models and three
    items each."""
    from paperflow.core.io import write_frame
    from paperflow.doubt import vl_uncertainty as vlu

    _, cache = hub
    raw, items = str(tmp_path / "raw.parquet"), str(tmp_path / "items.parquet")
    vlm_json, judge_json = str(tmp_path / "vlm.json"), str(tmp_path / "judge.json")
    download_model(VLM_SPEC, slug="doubt", key="vlms.tiny.revision", cache=str(cache), out=vlm_json)
    download_model(JUDGE_SPEC, slug="doubt", key="judge.revision", cache=str(cache), out=judge_json)
    paper.download_benchmark("ScienceQA", BENCHES["ScienceQA"], str(cache), raw)
    assert paper.preprocess(raw, None, items) == 3  # idx 0, 2, 3
    samples, prompts = str(tmp_path / "samples.parquet"), str(tmp_path / "prompts.parquet")
    pd.DataFrame({"idx": [0, 2, 3], "ans0": ["1", "cat", "(0)"]}).to_parquet(samples)
    questions = [[f"{q} cat", f"{q} dog", q] for q in read_frame(items)[0]["question"]]
    pd.DataFrame({"idx": [0, 2, 3], "questions": questions}).to_parquet(prompts)
    save_tiny_nli(tmp_path / "nli", 2)
    nli_json = str(tmp_path / "nli.json")
    Path(nli_json).write_text(json.dumps({"hub": "org/nli", "revision": SHA, "folder": str(tmp_path / "nli")}))
    nli = {"device": "cpu", "batch_size": 4, "condition_on_question": True}
    ff, ff_samples, ff_perturbed = (str(tmp_path / f"ff_{k}.parquet") for k in ("items", "samples", "perturbed"))
    questions = ["What is it ?", "Which colour ?", "Why ?"]
    write_frame(ff, pd.DataFrame({"idx": [3, 7, 8], "question": questions, "kind": bm.FREE_FORM}), {})
    answers = [["cat", "a cat", "dog"], ["red", "blue", "red"], ["the cat", "the dog", "a cat"]]
    pd.DataFrame({"idx": [3, 7, 8], "ans0": ["cat", "red", "a"], "A": answers, "B": answers[::-1]}).to_parquet(
        ff_samples
    )
    pd.DataFrame({"idx": [3, 7, 8], "P": answers}).to_parquet(ff_perturbed)
    return {
        "sample": lambda j: paper.sample("tiny", vlm_json, VLM_SPEC, items, SAMPLING, 1, journal=j),
        "judge": lambda j: paper.judge(judge_json, JUDGE_SPEC, raw, samples, 1, journal=j),
        "rephrase": lambda j: vlu.rephrase(judge_json, JUDGE_SPEC, VLU, items, 1, journal=j),
        "sample_perturbed": lambda j: vlu.sample(
            "tiny", "ScienceQA", vlm_json, VLM_SPEC, items, prompts, VLU, 1, journal=j
        ),
        "entail": lambda j: paper.entail(nli_json, nli, ff, ff_samples, journal=j),
        "entail_perturbed": lambda j: vlu.entail(nli_json, nli, ff, ff_perturbed, journal=j),
    }


@pytest.mark.parametrize("case", sorted(UNITS))
def test_a_generation_job_killed_part_way_reruns_only_the_items_left_and_writes_what_an_unkilled_one_writes(
    case, hub, tmp_path, monkeypatch
):
    from paperflow.doubt import entailment

    job, (owner, attr, per_item), items = resume_jobs(hub, tmp_path)[case], UNITS[case], 3
    calls = Calls(monkeypatch, entailment if owner == "entailment" else owner, attr)
    whole = calls.run(job, tmp_path / "whole" / "rows.jsonl")
    assert calls.n == per_item * items
    journal = tmp_path / "killed" / "rows.jsonl"
    kill_at = per_item + min(2, per_item)  # in the second item (its second call where it has several)
    with pytest.raises(Killed):
        calls.run(job, journal, kill_at=kill_at)
    assert len(journal.read_text().splitlines()) == 1  # the first item's row; the second item's calls are lost
    resumed = calls.run(job, journal)
    assert calls.n == per_item * (items - 1)  # the first item is not asked again
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)
    written = [io.BytesIO() for _ in range(2)]
    whole.to_parquet(written[0], index=False)
    resumed.to_parquet(written[1], index=False)
    assert written[0].getvalue() == written[1].getvalue()
    # a finished job rerun asks nothing (not even a model load) and gives the same frame
    again = calls.run(job, journal)
    assert calls.n == 0
    pd.testing.assert_frame_equal(again, whole, check_exact=True)
