"""specflow at paper scale, offline: benchmark parquet files in lmms-lab's layouts and columns (written here, laid out
as snapshot_download lays them out), the download stage asking only for the pinned files and refusing an unpinned
one with `paperflow pin specflow` named; a tiny LLaVA (transformers' LlavaForConditionalGeneration: a tiny CLIP
vision tower + a tiny Llama, saved with save_pretrained as the Hub snapshot) through the condensation hook, whose
unpruned path reproduces the model's own forward; the download -> evaluate -> score -> report path on the CPU; the
scorers against hand-computed values; the config's paper-scale claims judged with benchmarks as items, void when
random selection does as well; config errors by name; and the
paper-scale DAG with GPUs on the evaluate rule only."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fake_hub import FakeHub, install

from paperflow.core.claims import CONTROL_HOLDS, HELD, judge_all, parse_claims
from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.io import read_frame
from paperflow.specflow import benchmarks as bm
from paperflow.specflow import paper

SHA = "0123456789abcdef0123456789abcdef01234567"
WORDS = "USER: ASSISTANT: yes no is there a cat dog in the image Answer question using single word or phrase.".split()
SIDE, PATCH = 24, 4  # a 6 x 6 grid: N = 36 visual tokens
N = (SIDE // PATCH) ** 2


def png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def image_cell(seed: int) -> dict:
    return {"bytes": png(seed), "path": f"{seed}.png"}


def hub_tables() -> dict[str, dict[str, pd.DataFrame]]:
    """{repo: {repo path: frame}} with lmms-lab's columns (the Hub `Image` feature as {'bytes', 'path'})."""
    pope = pd.DataFrame(
        {
            "id": [str(i) for i in range(6)],
            "question_id": [str(i + 1) for i in range(6)],
            "question": ["Is there a cat in the image?"] * 6,
            "answer": ["yes", "no", "yes", "no", "yes", "no"],
            "image_source": ["COCO_val2014_0001"] * 6,
            "image": [image_cell(i) for i in range(6)],
            "category": ["adversarial", "adversarial", "popular", "popular", "random", "random"],
        }
    )
    mme = pd.DataFrame(
        {
            "question_id": ["code/1.png", "code/1.png", "count/2.png", "count/2.png"],
            "question": ["Is there a cat? Please answer yes or no."] * 4,
            "answer": ["Yes", "No", "Yes", "No"],
            "image": [image_cell(10 + i) for i in range(4)],
            "category": ["code_reasoning"] * 2 + ["count"] * 2,
        }
    )
    sqa = pd.DataFrame(
        {
            "image": [image_cell(20), image_cell(21)],
            "question": ["Which is a cat?", "Which is a dog?"],
            "choices": [["cat", "dog"], ["cat", "dog", "bird"]],
            "answer": [0, 1],
            "hint": ["", "A farm."],
            "task": ["closed choice"] * 2,
            "grade": ["grade2"] * 2,
            "subject": ["natural science"] * 2,
            "topic": ["biology"] * 2,
            "category": ["Classification"] * 2,
            "skill": ["x"] * 2,
            "lecture": [""] * 2,
            "solution": [""] * 2,
        }
    )
    textvqa = pd.DataFrame(
        {
            "image_id": ["a", "b"],
            "question_id": [34602, 34603],
            "question": ["what word is it?", "what brand?"],
            "question_tokens": [["what"], ["what"]],
            "image": [image_cell(30), image_cell(31)],
            "image_width": [40, 40],
            "image_height": [30, 30],
            "flickr_original_url": ["u", "u"],
            "flickr_300k_url": ["u", "u"],
            "answers": [["cat"] * 4 + ["dog"] * 6, ["nokia"] * 10],
            "image_classes": [["x"], ["x"]],
            "set_name": ["val", "val"],
            "ocr_tokens": [["cat"], ["nokia"]],
        }
    )
    gqa_questions = pd.DataFrame(
        {
            "id": ["201307251", "201640614", "202225914"],
            "imageId": ["n1", "n2", "n1"],
            "question": ["Is it a cat?", "What animal is it?", "Which color is it?"],
            "answer": ["yes", "dog", "red"],
            "fullAnswer": ["Yes, it is.", "It is a dog.", "It is red."],
            "isBalanced": [True] * 3,
        }
    )
    gqa_images = pd.DataFrame({"id": ["n0", "n1", "n2"], "image": [image_cell(40), image_cell(41), image_cell(42)]})
    return {
        "lmms-lab/MMBench": {
            "en/dev-00000-of-00001.parquet": mmbench_table(),
            "en/test-00000-of-00001.parquet": mmbench_table(),
            "cn/dev-00000-of-00001.parquet": mmbench_table(),
        },
        "lmms-lab/GQA": {
            "testdev_balanced_instructions/testdev-00000-of-00001.parquet": gqa_questions,
            "testdev_balanced_images/testdev-00000-of-00001.parquet": gqa_images,
            "train_balanced_instructions/train-00000-of-00001.parquet": gqa_questions,
        },
        "lmms-lab/POPE": {"data/test-00000-of-00001.parquet": pope, "Full/adversarial-00000-of-00001.parquet": pope},
        "lmms-lab/MME": {"data/test-00000-of-00001-abc.parquet": mme},
        "lmms-lab/ScienceQA": {
            "ScienceQA-IMG/test-00000-of-00001.parquet": sqa,
            "ScienceQA-IMG/train-00000-of-00001.parquet": sqa,
        },
        "lmms-lab/textvqa": {
            "data/validation-00000-of-00001.parquet": textvqa,
            "data/train-00000-of-00001.parquet": textvqa,
        },
    }


def mmbench_table() -> pd.DataFrame:
    """lmms-lab/MMBench's columns: a 4-option question with a hint, a 2-option one (C, D empty), and a circular copy
    of the first (index + 1e6, options rotated) as the official TSV carries them."""
    return pd.DataFrame(
        {
            "index": [0, 1, 1000000],
            "question": ["Which animal is it?", "Is the cat black?", "Which animal is it?"],
            "hint": ["A farm photo.", None, "A farm photo."],
            "A": ["dog", "yes", "cat"],
            "B": ["cat", "no", "bird"],
            "C": ["bird", None, "cow"],
            "D": ["cow", "nan", "dog"],
            "answer": ["B", "A", "A"],
            "category": ["object_localization", "attribute_recognition", "object_localization"],
            "image": [image_cell(50), image_cell(51), image_cell(50)],
            "source": ["x"] * 3,
            "L2-category": ["y"] * 3,
            "comment": ["-"] * 3,
            "split": ["dev"] * 3,
        }
    )


BENCHES = {
    "gqa": {
        "hub": "lmms-lab/GQA",
        "files": ["testdev_balanced_instructions/testdev-*.parquet", "testdev_balanced_images/testdev-*.parquet"],
    },
    "pope": {"hub": "lmms-lab/POPE", "files": ["data/test-*.parquet"]},
    "mme": {"hub": "lmms-lab/MME", "files": ["data/test-*.parquet"]},
    "sqa": {"hub": "lmms-lab/ScienceQA", "files": ["ScienceQA-IMG/test-*.parquet"]},
    "textvqa": {"hub": "lmms-lab/textvqa", "files": ["data/validation-*.parquet"]},
    "mmbench": {"hub": "lmms-lab/MMBench", "files": ["en/dev-*.parquet"]},
}


def bench(name: str, revision=SHA, limit=None) -> dict:
    return {**BENCHES[name], "repo_type": "dataset", "revision": revision, "kind": name, "limit": limit}


def save_tiny_llava(folder: Path) -> None:
    """A tiny LLaVA-1.5 layout: LlavaForConditionalGeneration (CLIP vision 24 px / 4 px patches, 3 layers; Llama 2
    layers), a word-level tokenizer and a CLIP image processor, as save_pretrained writes them."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    from paperflow.core.lm.tokenizer import save_tokenizer, word_level_tokenizer

    tok = word_level_tokenizer(WORDS + ["<image>"])
    vision = CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=SIDE,
        patch_size=PATCH,
        projection_dim=16,
    )
    text = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=len(tok) - 1,
        vision_feature_layer=-2,
        projector_hidden_act="gelu",
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(folder)
    save_tokenizer(tok, folder)
    CLIPImageProcessor(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE}).save_pretrained(folder)


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("llava")
    save_tiny_llava(folder)
    return folder


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny_llava):
    """download_pretrained replaced by a fake Hub: a dataset repo writes the fixture's parquet files matching the
    allow patterns (only those), the model repo copies the tiny LLaVA. Returns (calls, cache)."""
    hub = install(monkeypatch, FakeHub(hub_tables(), model=tiny_llava))
    return hub.calls, tmp_path / "cache"


PRETRAINED = {
    "hub": "org/tiny-llava",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*.json", "*.safetensors"],
    "dtype": "float32",
    "device": "cpu",
    "tokens": N,
    "max_new_tokens": 3,
    "fastv_layer": 1,
}
SPECFLOW = {
    "k": 6,
    "tau": 10.0,
    "alpha": 0.5,
    "steps": 2,
    "m": 2,
    "delta": None,
    "symmetric": False,
    "allocation": "quadtree",
    "sinks": True,
    "matched": False,
    "graph": "knn",
}


def test_download_fetches_only_the_pinned_files_and_normalises_each_benchmark(hub, tmp_path):
    calls, cache = hub
    pj = tmp_path / "models" / "pretrained.json"
    download_model(PRETRAINED, slug="specflow", key="pretrained.revision", cache=str(cache), out=str(pj))
    counts = {
        name: paper.download_benchmark(name, bench(name), str(cache), str(tmp_path / f"{name}.parquet"))
        for name in BENCHES
    }
    assert counts == {"gqa": 3, "pope": 6, "mme": 4, "sqa": 2, "textvqa": 2, "mmbench": 4 + 2}  # one row a rotation
    model_call = {k: v for k, v in calls[0].items() if k != "written"}
    assert model_call == {
        "name": "org/tiny-llava",
        "revision": SHA,
        "patterns": ["*.json", "*.safetensors"],
        "repo_type": "model",
    }
    written = {c["name"]: c["written"] for c in calls[1:]}
    assert all(c["revision"] == SHA and c["repo_type"] == "dataset" for c in calls[1:])
    assert written == {
        "lmms-lab/GQA": [
            "testdev_balanced_images/testdev-00000-of-00001.parquet",
            "testdev_balanced_instructions/testdev-00000-of-00001.parquet",
        ],
        "lmms-lab/POPE": ["data/test-00000-of-00001.parquet"],
        "lmms-lab/MME": ["data/test-00000-of-00001-abc.parquet"],
        "lmms-lab/ScienceQA": ["ScienceQA-IMG/test-00000-of-00001.parquet"],
        "lmms-lab/textvqa": ["data/validation-00000-of-00001.parquet"],
        "lmms-lab/MMBench": ["en/dev-00000-of-00001.parquet"],
    }
    assert json.loads(pj.read_text())["folder"].endswith(f"models/org--tiny-llava/{SHA}")
    assert all(read_frame(tmp_path / f"{name}.parquet")[0].qid.is_unique for name in BENCHES)
    frame, meta = read_frame(tmp_path / "sqa.parquet")
    assert list(frame.columns) == bm.QUESTION_COLUMNS
    assert meta == {
        "benchmark": "sqa",
        "kind": "sqa",
        "hub": "lmms-lab/ScienceQA",
        "revision": SHA,
        "files": ["ScienceQA-IMG/test-*.parquet"],
    }
    assert frame.question[1] == (
        "Context: A farm.\nWhich is a dog?\nA. cat\nB. dog\nC. bird\nAnswer with the option's letter from the given "
        "choices directly."
    )
    assert [json.loads(a) for a in frame.answers] == [["A"], ["B"]]
    assert frame.image[0] == png(20)
    mme, _ = read_frame(tmp_path / "mme.parquet")
    assert list(mme.group) == ["code_reasoning/code/1.png"] * 2 + ["count/count/2.png"] * 2
    assert mme.qid.is_unique and list(mme.answers) == ['["yes"]', '["no"]'] * 2
    gqa, _ = read_frame(tmp_path / "gqa.parquet")  # each question joined to its image by imageId
    assert list(gqa.image) == [png(41), png(42), png(41)] and list(gqa.qid) == ["201307251", "201640614", "202225914"]
    tv, _ = read_frame(tmp_path / "textvqa.parquet")
    assert json.loads(tv.answers[0]) == ["cat"] * 4 + ["dog"] * 6
    limited = paper.download_benchmark("pope", bench("pope", limit=2), str(cache), str(tmp_path / "p2.parquet"))
    assert limited == 2
    mmb, meta = read_frame(tmp_path / "mmbench.parquet")  # the circular copy dropped, the rotations rebuilt
    assert list(mmb.qid) == ["0/0", "0/1", "0/2", "0/3", "1/0", "1/1"] and list(mmb.group) == ["0"] * 4 + ["1"] * 2
    assert mmb.question[1] == (
        "A farm photo.\nWhich animal is it?\nA. cat\nB. bird\nC. cow\nD. dog\n"
        "Answer with the option's letter from the given choices directly."
    )
    assert mmb.question[4] == (
        "Is the cat black?\nA. yes\nB. no\nAnswer with the option's letter from the given choices directly."
    )
    assert [json.loads(a)[0] for a in mmb.answers] == ["B", "A", "D", "C", "A", "B"]
    assert json.loads(mmb.answers[1])[1] == {"A": "cat", "B": "bird", "C": "cow", "D": "dog"}
    assert mmb.image[0] == png(50) and meta["kind"] == "mmbench"
    one = paper.download_benchmark("mmbench", bench("mmbench", limit=1), str(cache), str(tmp_path / "m1.parquet"))
    assert one == 4  # `limit` counts questions: all four rotations of the first


def test_an_unpinned_revision_is_refused_with_the_pin_command_named(hub, tmp_path, monkeypatch):
    from paperflow.core import download

    calls, cache = hub
    monkeypatch.setattr(download, "read_lock_revisions", lambda slug, root=None: {})  # whatever the checkout holds
    with pytest.raises(
        UnpinnedDownload, match=r"benchmarks\.pope\.revision .*dataset:lmms-lab/POPE.*`paperflow pin specflow`"
    ):
        paper.download_benchmark("pope", bench("pope", revision=None), str(cache), str(tmp_path / "x.parquet"))
    with pytest.raises(UnpinnedDownload, match=r"pretrained\.revision .*`paperflow pin specflow`"):
        download_model(
            {**PRETRAINED, "revision": None},
            slug="specflow",
            key="pretrained.revision",
            cache=str(cache),
            out=str(tmp_path / "p.json"),
        )
    with pytest.raises(ConfigError, match="not a pinned revision"):
        download_model(
            {**PRETRAINED, "revision": "main"},
            slug="specflow",
            key="pretrained.revision",
            cache=str(cache),
            out=str(tmp_path / "p.json"),
        )
    assert calls == []  # nothing was fetched


def test_the_hook_feeds_llava_what_its_own_forward_does_and_condenses_to_the_budget(tiny_llava):
    """Unpruned, the spliced prompt embeddings give the logits of LlavaForConditionalGeneration's own forward
    (input ids with N image tokens + pixel values); Z is its projected image features; Top-K feeds K tokens,
    SpecFlow K + 2 (sinks) and the budget-matched SpecFlow K."""
    from paperflow.specflow import llava

    model = llava.load(str(tiny_llava), "float32", torch.device("cpu"))
    assert model.grid == (6, 6) and model.layer == -2
    px = llava.pixels(model, png(3))
    toks = llava.vision_tokens(model, px)
    feats = model.model.get_image_features(
        pixel_values=px, vision_feature_layer=-2, vision_feature_select_strategy="default"
    ).pooler_output[0]
    np.testing.assert_allclose(toks.z[0], feats.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert toks.cls.shape == (1, N) and toks.cls.sum() == pytest.approx(1.0, abs=0.05)  # [CLS] row minus self
    assert toks.keys.shape[1] == N + 1 and toks.attn.shape == (1, N, N)

    question = "is there a cat"
    embeds = llava.prompt_embeds(model, question, torch.from_numpy(toks.z).float())
    tok, image_id = model.tokenizer, model.model.config.image_token_id
    before, after = llava.PROMPT.format(question=question).split(llava.IMAGE)
    ids = tok(before)["input_ids"] + [image_id] * N + tok(after, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        own = model.model(input_ids=torch.tensor([ids]), pixel_values=px).logits[0, -1]
        ours = model.model(inputs_embeds=embeds).logits[0, -1]
    torch.testing.assert_close(ours, own, rtol=1e-5, atol=1e-5)

    cfg = {"specflow": SPECFLOW}
    fed = {
        m: llava.answer(model, png(3), question, m, 8, cfg, 0, 2)["k_fed"]
        for m in ("full", "topk", "visionzip", "specflow", "specflow_matched")
    }
    assert fed == {"full": N, "topk": 8, "visionzip": 8, "specflow": 10, "specflow_matched": 8}
    fastv = llava.answer(model, png(3), question, "fastv", 8, {**cfg, "pretrained": PRETRAINED}, 0, 2)
    assert fastv["k_fed"] == 8 and isinstance(fastv["prediction"], str)


def test_the_paper_path_runs_download_evaluate_score_report_on_a_tiny_llava(hub, tmp_path):
    from paperflow.core.report import publish

    _, cache = hub
    pj = str(tmp_path / "models" / "pretrained.json")
    download_model(PRETRAINED, slug="specflow", key="pretrained.revision", cache=str(cache), out=pj)
    cfg = {
        "pretrained": PRETRAINED,
        "specflow": SPECFLOW,
        "seeds": [0],
        "ratios": [0.667, 0.889],
        "methods": ["full", "topk", "visionzip", "random", "specflow"],
        "report_ratio": 0.889,
        "scale": "paper",
    }
    assert paper.jobs(cfg) == [
        ("full", N),
        ("topk", 12),
        ("topk", 4),
        ("visionzip", 12),
        ("visionzip", 4),
        ("random", 12),
        ("random", 4),
        ("specflow", 12),
        ("specflow", 4),
    ]
    cfg["ratios"] = [0.889]  # the jobs at K = 4 only: each job loads the model (CI time)
    scores = []
    for name in ("pope", "sqa"):
        questions = str(tmp_path / "raw" / f"{name}.parquet")
        paper.download_benchmark(name, bench(name, limit=3), str(cache), questions)
        answers = {}
        for method, k in paper.jobs(cfg):
            answers[(method, k)] = str(tmp_path / "answers" / name / f"{method}_k{k}.parquet")
            info = paper.evaluate(method, k, pj, questions, cfg, answers[(method, k)])
            assert info["benchmark"] == name and info["revision"] == SHA
        got, _ = read_frame(answers[("specflow", 4)])
        assert list(got.k_fed) == [6] * len(got) and got.prediction.map(type).eq(str).all()
        scores.append(paper.score_benchmark(answers))
    scores = pd.concat(scores, ignore_index=True)
    assert len(scores) == 2 * 5 and scores.score.between(0, 100).all()
    assert set(scores.questions) == {3, 2} and set(scores[scores.method == "specflow"].k_fed) == {6.0}
    report = paper.build_paper_report(scores, cfg)
    outputs = {
        "report": tmp_path / "report.md",
        "metrics": tmp_path / "metrics.json",
        "metrics_table": tmp_path / "metrics.parquet",
        "table_relative": tmp_path / "relative.csv",
        "table_scores": tmp_path / "scores.csv",
        "figure_relative": tmp_path / "relative.png",
    }
    claims = [  # the paper-scale claims whose methods this run evaluates (specflow_matched's is reported only)
        c for c in load_paper_config("specflow", "paper")["claims"] if c["method"] in cfg["methods"]
    ]
    publish(report, outputs, paper="specflow", scale="paper", claims=claims)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert {c["id"] for c in metrics["claims"]} == {"paper_specflow_vs_topk", "paper_specflow_vs_visionzip"}
    table = paper.relative_table(scores)
    assert [r["method"] for r in metrics["relative"]] == list(table.method)
    assert (tmp_path / "relative.png").stat().st_size > 0 and "paper_specflow_vs_topk" in outputs["report"].read_text()


def test_a_cuda_device_without_a_gpu_fails_naming_the_key(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    cfg = {"pretrained": {**PRETRAINED, "device": "cuda"}, "specflow": SPECFLOW, "seeds": [0]}
    with pytest.raises(ConfigError, match="pretrained.device"):
        paper.evaluate("topk", 4, str(tmp_path / "none.json"), str(tmp_path / "none.parquet"), cfg, "out")


def _answers(kind, rows):
    return pd.DataFrame(rows, columns=["prediction", "answers", "category", "group"]).assign(
        answers=lambda f: f.answers.map(json.dumps)
    )


def test_the_scorers_match_hand_computed_values():
    pope = _answers(
        "pope",
        [
            ("Yes.", ["yes"], "adv", "1"),
            ("yes", ["no"], "adv", "2"),
            ("No", ["yes"], "adv", "3"),
            ("no", ["no"], "pop", "4"),
            ("yes", ["yes"], "pop", "5"),
        ],
    )
    # adv: tp 1, fp 1, fn 1 -> F1 0.5; pop: tp 1 -> 1.0
    assert bm.score("pope", pope) == pytest.approx(75.0)
    mme = _answers(
        "mme",
        [
            ("Yes", ["yes"], "count", "a"),
            ("No", ["no"], "count", "a"),
            ("Yes", ["yes"], "count", "b"),
            ("Yes", ["no"], "count", "b"),
            ("no", ["yes"], "ocr", "c"),
            ("no", ["no"], "ocr", "c"),
        ],
    )
    # count: acc 3/4, acc+ 1/2 -> 125; ocr: acc 1/2, acc+ 0 -> 50
    assert bm.score("mme", mme) == pytest.approx(175.0)
    sqa = _answers("sqa", [("B", ["B"], "c", "1"), ("(A) cat", ["A"], "c", "2"), ("The answer is B", ["B"], "c", "3")])
    assert bm.score("sqa", sqa) == pytest.approx(200 / 3)
    tv = _answers("textvqa", [("The Cat.", ["cat"] * 2 + ["dog"] * 8, "t", "1"), ("nokia", ["nokia"] * 10, "t", "2")])
    assert bm.score("textvqa", tv) == pytest.approx(100 * (2 / 3 + 1) / 2)
    gqa = _answers("gqa", [("Dog.", ["dog"], "gqa", "1"), ("a dog", ["dog"], "gqa", "2"), ("Red", ["red"], "gqa", "3")])
    assert bm.score("gqa", gqa) == pytest.approx(200 / 3)
    assert bm.yes_no("maybe yes") == "other" and bm.letter("E.") == "E" and bm.letter("none") == ""


def _paper_verdicts(specflow, random=60.0):
    cfg = {"pretrained": {"tokens": 576}, "seeds": [0], "ratios": [0.889], "scale": "paper"}
    rows = [
        ("full", 576, 80.0),
        ("topk", 64, 60.0),
        ("visionzip", 64, 70.0),
        ("specflow", 64, specflow),
        ("specflow_matched", 64, 72.0),
        ("random", 64, random),
    ]
    benches = {"pope": 1.0, "mme": 20.0, "gqa": 0.9, "sqa": 1.1, "textvqa": 0.8, "mmbench": 1.05}
    scores = pd.DataFrame(
        [
            {"benchmark": b, "method": m, "budget": k, "k_fed": k, "score": s * f * (1 + 0.01 * i)}
            for i, (b, f) in enumerate(benches.items())
            for m, k, s in rows
        ]
    )
    table = paper.metrics_table(scores, cfg)
    specs = parse_claims(load_paper_config("specflow", "paper")["claims"], "config/specflow.yaml")
    return {v.id: v for v in judge_all(specs, table, "paper")}, scores


def test_paper_claims_hold_on_an_effect_and_fail_on_their_controls():
    found, scores = _paper_verdicts(76.0)
    assert {k: (v.verdict, v.gated) for k, v in found.items()} == {
        "paper_specflow_vs_topk": (HELD, True),
        "paper_specflow_vs_visionzip": (HELD, True),
        "paper_matched_vs_topk": (HELD, False),
    }
    v = found["paper_specflow_vs_topk"]
    assert v.n_units == 6 and v.unit == "item" and v.control["verdict"] != HELD  # benchmarks are the items
    assert v.value == pytest.approx(100 * (76.0 - 60.0) / 80.0)
    table = paper.relative_table(scores)  # the items' mean is Table 1's Average
    assert float(table[(table.method == "specflow")].relative.iloc[0]) == pytest.approx(95.0)
    assert _paper_verdicts(60.0)[0]["paper_specflow_vs_topk"].verdict == "refuted"  # Top-K's scores in its place
    # random selection as good as SpecFlow: the claims are void
    voided = _paper_verdicts(76.0, random=76.0)[0]
    assert voided["paper_specflow_vs_topk"].verdict == CONTROL_HOLDS
    assert voided["paper_specflow_vs_visionzip"].verdict == CONTROL_HOLDS


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("    fastv_layer: 2 ", "    fastv_layr: 2 "), "fastv_layr"),
        (("      kind: textvqa\n", "      kind: vqav2\n"), "kind"),
        (("    revision: a272c74b2481d8aff3aa6fc2c4bf891fe57334fb", "    revision: main"), "revision"),
        (("    tokens: 576 ", "    tokenz: 576 "), "tokenz"),
    ],
)
def test_paper_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "specflow.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("specflow", "paper", repo_copy)


def test_paper_scale_dry_run_builds_the_dag_with_gpus_on_evaluate_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[specflow]")
    cfg = load_paper_config("specflow", "paper")
    n_bench = len(cfg["benchmarks"])
    counts = dict(re.findall(r"^(specflow_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts == {
        "specflow_download_model": "1",
        "specflow_download": str(n_bench),
        "specflow_evaluate": str(n_bench * len(paper.jobs(cfg))),
        "specflow_score": str(n_bench),
        "specflow_report": "1",
    }
    assert len(paper.jobs(cfg)) == 1 + 3 * (len(cfg["methods"]) - 1)
    gpus = {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
    assert gpus["specflow_evaluate"] == {1}
    assert all(v == {0} for r, v in gpus.items() if r != "specflow_evaluate")


def test_a_question_whose_image_is_missing_is_refused(tmp_path):
    (tmp_path / "q").mkdir()
    (tmp_path / "i").mkdir()
    pd.DataFrame({"id": ["1"], "imageId": ["n9"], "question": ["?"], "answer": ["x"]}).to_parquet(
        tmp_path / "q/a.parquet"
    )
    pd.DataFrame({"id": ["n1"], "image": [image_cell(0)]}).to_parquet(tmp_path / "i/a.parquet")
    with pytest.raises(ValueError, match="1 questions name an imageId absent"):
        bm.read_parquet_files(tmp_path, ["q/*.parquet", "i/*.parquet"])
    with pytest.raises(FileNotFoundError, match=r"no parquet file .* matches \['x/\*.parquet'\]"):
        bm.read_parquet_files(tmp_path, ["x/*.parquet"])


# MMBench (CircularEval) and FastV inside the language model


def test_mmbench_rotations_and_the_option_parser_follow_llava_and_the_official_rules():
    assert bm.rotations(["dog", "cat", "bird", "cow"], "C") == [
        (["dog", "cat", "bird", "cow"], "C"),
        (["cat", "bird", "cow", "dog"], "B"),
        (["bird", "cow", "dog", "cat"], "A"),
        (["cow", "dog", "cat", "bird"], "D"),
    ]
    assert bm.rotations(["yes", "no"], "B") == [(["yes", "no"], "B"), (["no", "yes"], "A")]
    with pytest.raises(ValueError, match="names no option"):
        bm.rotations(["yes", "no"], "C")
    assert (
        bm.mmbench_prompt("mmbench_cn", "它是什么?", float("nan"), ["猫", "狗"])
        == "它是什么?\nA. 猫\nB. 狗\n请直接回答选项字母。"
    )
    choices = {"A": "dog", "B": "cat", "C": "bird", "D": "cow"}
    cases = {
        "C": "C",
        "C.": "C",
        "(B) cat": "B",
        "The answer is D": "D",
        "B: cat": "B",
        "A": "A",
        "A cat sits on a mat": "B",  # 'A' among > 3 words is an article: the option text decides
        "A or B": "",
        "It could be a dog or a cat": "",
        "the bird": "C",
        "": "",
        "Sorry, I can't help with images of people yet.": "Z",
        "Z": "Z",
    }
    assert {text: bm.infer_option(text, choices) for text in cases} == cases


def test_circular_eval_counts_a_question_only_when_every_rotation_is_right():
    choices = {"A": "dog", "B": "cat"}

    def row(prediction, truth, group):
        return {"prediction": prediction, "answers": json.dumps([truth, choices]), "category": "c", "group": group}

    frame = pd.DataFrame(
        [
            row("A", "A", "q0"),
            row("B", "B", "q0"),  # both rotations right
            row("cat", "B", "q1"),
            row("B", "A", "q1"),  # one wrong: the question fails
            row("I think A or B", "A", "q2"),
            row("A", "A", "q2"),  # unparsed: counts wrong
            row("dog", "A", "q3"),
            row("(A)", "A", "q3"),
        ]
    )
    hits = bm.circular_hits(frame)
    assert hits.to_dict() == {"q0": True, "q1": False, "q2": False, "q3": True}
    assert bm.score("mmbench", frame) == pytest.approx(50.0)
    assert bm.score("mmbench", frame.assign(prediction=["A", "B", "B", "A", "A", "A", "A", "A"])) == 100.0


@pytest.fixture(scope="module")
def fastv_case(tiny_llava):
    from paperflow.specflow import llava

    model = llava.load(str(tiny_llava), "float32", torch.device("cpu"))
    question = "is there a cat"
    px = llava.pixels(model, png(3))
    embeds = llava.prompt_embeds(model, question, torch.from_numpy(llava.vision_tokens(model, px).z).float())
    return model, question, px, embeds, llava.image_start(model, question)


def test_fastv_keeping_every_token_is_the_unpruned_model(fastv_case):
    """Keep ratio 1.0: the first logits equal LlavaForConditionalGeneration's own forward (input ids with N image
    tokens + pixel values), and the greedy tokens decoded on the cache equal `generate`'s."""
    from paperflow.specflow import llava

    model, question, px, embeds, start = fastv_case
    ids, info = llava.fastv_generate(model, embeds, start, N, N, 1, 4)
    tok, image_id = model.tokenizer, model.model.config.image_token_id
    before, after = llava.PROMPT.format(question=question).split(llava.IMAGE)
    prompt = tok(before)["input_ids"] + [image_id] * N + tok(after, add_special_tokens=False)["input_ids"]
    assert prompt[start : start + N] == [image_id] * N and start == len(tok(before)["input_ids"])
    with torch.no_grad():
        own = model.model(input_ids=torch.tensor([prompt]), pixel_values=px).logits[0, -1]
    torch.testing.assert_close(info["logits"][0], own, rtol=1e-5, atol=1e-5)
    mask = torch.ones(embeds.shape[:2], dtype=torch.long)
    ref = model.model.generate(
        inputs_embeds=embeds, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0
    )
    assert ids == ref[0].tolist() and info["cache"] == [len(prompt)] * 2


def test_fastv_prunes_to_the_budget_after_layer_k_keeping_the_top_attention_tokens(fastv_case):
    from paperflow.specflow import llava

    model, _, _, embeds, start = fastv_case
    length, budget = embeds.shape[1], 5
    seen: list[int] = []
    layers = model.model.model.language_model.layers
    hooks = [layer.register_forward_pre_hook(lambda mod, args: seen.append(args[0].shape[1])) for layer in layers]
    try:
        ids, info = llava.fastv_generate(model, embeds, start, N, budget, 1, 3)
    finally:
        for hook in hooks:
            hook.remove()
    pruned = length - N + budget
    assert seen[:2] == [length, pruned]  # prefill: layer 1 (<= K) every token, layer 2 (> K) the budget
    assert seen[2:] == [1, 1] * (len(ids) - 1)  # decoding: one query per layer
    assert info["cache"] == [length, pruned]
    kept = info["kept"]
    image = kept[(kept >= start) & (kept < start + N)]
    assert len(image) == budget and len(kept) == pruned
    # the model's own eager attention of layer K (1-based), the prompt's last row, heads averaged
    lm = model.model.model.language_model
    impl, lm.config._attn_implementation = lm.config._attn_implementation, "eager"
    try:
        with torch.no_grad():
            att = model.model(inputs_embeds=embeds, output_attentions=True).attentions[0][0, :, -1].mean(0)
    finally:
        lm.config._attn_implementation = impl
    assert set(image.tolist()) == set((att[start : start + N].topk(budget).indices + start).tolist())
    # hand-made: 2 text tokens, 4 image tokens, 1 text token; keep the 2 most attended image tokens
    hand = llava.fastv_keep(torch.tensor([0.5, 0.1, 0.05, 0.2, 0.01, 0.3, 0.9]), 2, 4, 2)
    assert hand.tolist() == [0, 1, 3, 5, 6]
    with pytest.raises(ValueError, match="budget 5 outside 1..4"):
        llava.fastv_keep(torch.zeros(7), 2, 4, 5)
    with pytest.raises(ValueError, match="fastv_layer 2 must lie in 1..1"):
        llava.fastv_generate(model, embeds, start, N, budget, 2, 3)


def test_mmbench_and_fastv_run_download_evaluate_score_on_a_tiny_llava(hub, tmp_path):
    _, cache = hub
    pj = str(tmp_path / "pretrained.json")
    download_model(PRETRAINED, slug="specflow", key="pretrained.revision", cache=str(cache), out=pj)
    questions = str(tmp_path / "mmbench.parquet")
    paper.download_benchmark("mmbench", bench("mmbench"), str(cache), questions)
    cfg = {"pretrained": PRETRAINED, "specflow": SPECFLOW, "seeds": [0]}
    answers = {}
    for method, k in (("full", N), ("fastv", 4)):
        answers[(method, k)] = str(tmp_path / f"{method}_k{k}.parquet")
        paper.evaluate(method, k, pj, questions, cfg, answers[(method, k)])
    got, meta = read_frame(answers[("fastv", 4)])
    assert meta["kind"] == "mmbench" and list(got.k_fed) == [4] * 6 and list(got.group) == ["0"] * 4 + ["1"] * 2
    scores = paper.score_benchmark(answers)
    assert list(scores.method) == ["fastv", "full"] and list(scores.questions) == [6, 6]
    expected = [100 * float(bm.circular_hits(read_frame(answers[key])[0]).mean()) for key in sorted(answers)]
    assert list(scores.score) == expected


def test_paper_scale_condenses_with_the_function_smoke_and_cpu_call(tiny_llava, monkeypatch):
    """One implementation: the condensation LLaVA's hook runs between its projector and its language model is
    paperflow.specflow.stages.condense, the function the smoke and cpu evaluation (stages._evaluate_split) calls,
    on the projector's tokens."""
    import inspect

    from paperflow.specflow import llava, stages

    assert "condense(method, toks, budget, cfg, seed, e)" in inspect.getsource(stages._evaluate_split)
    model = llava.load(str(tiny_llava), "float32", torch.device("cpu"))
    seen = []
    real = stages.condense

    def spy(method, toks, budget, cfg, seed, e=None):
        seen.append((method, toks.z.shape, budget))
        return real(method, toks, budget, cfg, seed, e)

    monkeypatch.setattr(stages, "condense", spy)
    out = llava.answer(model, png(3), "is there a cat", "specflow", 8, {"specflow": SPECFLOW}, 0, 2)
    assert seen == [("specflow", (1, N, model.model.config.text_config.hidden_size), 8)] and out["k_fed"] == 10


@pytest.mark.parametrize("method", ["random", "specflow"])
def test_evaluate_journals_each_answer_and_a_rerun_answers_only_the_missing_questions(hub, tmp_path, method):
    """Each question's answer goes to the job's journal; a rerun with part of it (a kill) answers only the rest and
    writes the uninterrupted run's answers (issue 43). `random` draws, so its per-question seeding is checked too."""
    from paperflow.specflow import llava

    _, cache = hub
    pj = str(tmp_path / "models" / "pretrained.json")
    download_model(PRETRAINED, slug="specflow", key="pretrained.revision", cache=str(cache), out=pj)
    cfg = {"pretrained": PRETRAINED, "specflow": SPECFLOW, "seeds": [0]}
    questions = str(tmp_path / "raw" / "pope.parquet")
    paper.download_benchmark("pope", bench("pope", limit=3), str(cache), questions)
    whole, resumed = str(tmp_path / "whole.parquet"), str(tmp_path / "resumed.parquet")
    journal = tmp_path / "ckpt" / "rows.jsonl"
    paper.evaluate(method, 4, pj, questions, cfg, whole, journal)
    lines = journal.read_text().splitlines(keepends=True)
    assert len(lines) == len(read_frame(questions)[0]) >= 2
    journal.write_text(lines[0])  # killed after the first question
    calls = []
    answer = llava.answer
    llava.answer = lambda *a, **k: calls.append(1) or answer(*a, **k)
    try:
        paper.evaluate(method, 4, pj, questions, cfg, resumed, journal)
    finally:
        llava.answer = answer
    assert len(calls) == len(lines) - 1
    pd.testing.assert_frame_equal(
        read_frame(whole)[0].drop(columns="prune_ms"), read_frame(resumed)[0].drop(columns="prune_ms")
    )
