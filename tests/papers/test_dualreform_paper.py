"""dualreform at paper scale, offline: TopiOCQA's files in their real layout and fields (conversation jsonl records,
corpus parquet shards) written by a fake Hub, the download asking only for those files at the pinned commits and
refusing an unpinned one with `paperflow pin dualreform` named, the bm25s index of the corpus saved by preprocess
and loaded by train and evaluate, a tiny Qwen2 model with a word-level tokenizer standing in for the pretrained
instruct model, sampling its own candidates and trained through TRL's SFTTrainer and DPOTrainer with LoRA
(train -> evaluate on the CPU, device `cpu`), the round's adapters reloaded to the same scores, the dense retriever (the MiniLM encoder standing in for GTR) indexing the corpus and searching it exactly,
the paper-scale claims failing on their negative control, config errors by name, and the paper-scale DAG with GPUs
on the train, evaluate and dense-index rules only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_hub import FakeHub, install

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.io import read_frame
from paperflow.dualreform import paper
from paperflow.dualreform import topiocqa as tq

SHA = "0123456789abcdef0123456789abcdef01234567"
TITLES = ["alpha", "beta", "gamma", "delta", "omega", "sigma"]
SECTIONS = ["history", "music", "sport"]
FILLER = "lorem ipsum dolor sit amet".split()
MODEL_SPEC = {
    "arch": "qwen2",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
}
CHAT = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def corpus_frame() -> pd.DataFrame:
    """The wiki corpus's columns: one passage per (title, section), ids as TopiOCQA writes them."""
    rows = []
    for t in TITLES:
        for s in SECTIONS:
            rows.append(
                {"id": f"wiki:{len(rows)}", "title": t, "sub_title": s, "contents": f"{t} {s} {' '.join(FILLER)}"}
            )
    return pd.DataFrame(rows)


def conversation_records(split: str, n_conv: int, seed: int) -> list[dict]:
    """TopiOCQA jsonl records: a topic per conversation, an elliptic follow-up about another section."""
    rng = np.random.default_rng(seed)
    corpus = corpus_frame()
    out = []
    for c in range(1, n_conv + 1):
        title = TITLES[int(rng.integers(len(TITLES)))]
        context: list[str] = []
        for t, section in enumerate(rng.choice(SECTIONS, size=2, replace=False), start=1):
            question = f"tell me about {title}" if t == 1 else f"and its {section}"
            answer = f"{section} {FILLER[t]}"
            gold = corpus[(corpus["title"] == title) & (corpus["sub_title"] == section)].iloc[0]
            out.append(
                {
                    "Conversation_no": c,
                    "Turn_no": t,
                    "Question": question,
                    "Answer": answer,
                    "Topic": title,
                    "Topic_section": section,
                    "Rationale": "",
                    "is_nq": False,
                    "Context": list(context),
                    "Additional_answers": [],
                    "Gold_passage": {"id": gold["id"], "title": title, "text": gold["contents"]},
                }
            )
            context += [question, answer]
    return out


def dataset_files(hub: str) -> dict:
    """A dataset repo's files at their repo paths: TopiOCQA's conversations and loading script, or the corpus shards."""
    files = {}
    if hub == "org/topiocqa":
        for split, name in tq.CONVERSATION_FILES.items():
            recs = conversation_records(split, 8 if split == "train" else 4, seed=len(split))
            files[name] = "".join(json.dumps(r) + "\n" for r in recs)
        files["TopiOCQA.py"] = "# loading script\n"
    else:
        corpus = corpus_frame()
        files["data/train-00000-of-00002.parquet"] = corpus.iloc[:9]
        files["data/train-00001-of-00002.parquet"] = corpus.iloc[9:]
        files["README.md"] = "corpus\n"
    return files


def tokenizer_words() -> list[str]:
    words = set(" ".join(corpus_frame()["contents"]).split()) | {"tell", "me", "about", "and", "its"}
    words |= set(" ".join([paper_lora().INSTRUCTION, "Conversation: Q: A: Utterance: Rewrite:"]).split())
    return sorted(words | {"<user>", "<assistant>"})


def paper_lora():
    from paperflow.dualreform import lora

    return lora


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """download_pretrained replaced by a fake Hub: the dataset repos lay out TopiOCQA's files, the model repo a tiny
    Qwen2 and a word-level tokenizer with a chat template. Returns (calls, cache)."""
    from paperflow.core.lm.encoders import minilm_folder
    from paperflow.core.lm.models import build_model, save_model
    from paperflow.core.lm.tokenizer import save_tokenizer, word_level_tokenizer

    tok = word_level_tokenizer(tokenizer_words(), chat_template=CHAT)

    def model(folder):
        save_model(build_model({**MODEL_SPEC, "vocab_size": len(tok)}, seed=0), folder)
        save_tokenizer(tok, folder)

    repos = {"org/topiocqa": dataset_files("org/topiocqa"), DENSE["hub"]: minilm_folder()}  # the sentence encoder:
    hub = FakeHub(repos, model=model, dataset=dataset_files("corpus"))  # the MiniLM files the kit ships
    return install(monkeypatch, hub).calls, tmp_path / "cache"


PRETRAINED = {
    "hub": "org/tiny-instruct",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*.json", "*.safetensors"],
    "dtype": "float32",
    "quantization": None,
    "device": "cpu",
    "max_prompt_tokens": 256,
    "score_batch_size": 16,
}
DENSE = {
    "hub": "org/sentence-encoder",
    "repo_type": "model",
    "revision": SHA,
    "files": ["*.json", "*.safetensors", "vocab.txt", "1_Pooling/*"],
    "dtype": "float32",
    "device": "cpu",
    "batch_size": 8,
    "max_seq_length": 64,
}
DATA = {
    "conversations": {"hub": "org/topiocqa", "repo_type": "dataset", "revision": SHA},
    "corpus": {"hub": "org/wiki", "repo_type": "dataset", "revision": SHA},
    "limit_conversations": {"train": None, "test": None},
}
LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}
TRL = {
    "learning_rate": 1e-2,
    "num_train_epochs": 1,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "max_length": 512,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "bf16": False,
}
CFG = {
    "pretrained": PRETRAINED,
    "lora": LORA,
    "trl_sft": TRL,
    "trl_dpo": {**TRL, "beta": 0.1, "loss_type": "sigmoid"},
    "iterations": 2,
    "generation": {"k": 4, "temperature": 1.0, "top_k": None, "max_new_tokens": 6},
}
GEN = CFG["generation"]


def prepared(hub, tmp_path):
    """download_model + download_data + preprocess on the fake Hub: (pretrained.json, turns.parquet, the index's
    marker file, as the rules name them)."""
    _, cache = hub
    pj = str(tmp_path / "models" / "pretrained.json")
    download_model(PRETRAINED, slug="dualreform", key="pretrained.revision", cache=str(cache), out=pj)
    raw = {k: str(tmp_path / "raw" / f"{k}.parquet") for k in ("passages", "turns")}
    paper.download_data(DATA, str(cache), raw["passages"], raw["turns"])
    table, index = str(tmp_path / "data" / "turns.parquet"), tmp_path / "data" / "bm25_index"
    paper.preprocess(raw["passages"], raw["turns"], {"k1": 0.9, "b": 0.4}, 1, table, index)
    return pj, table, str(index / tq.INDEX_DONE)


def test_download_fetches_only_the_pinned_files_and_writes_the_smoke_tables(hub, tmp_path):
    calls, cache = hub
    pj, _, _ = prepared(hub, tmp_path)
    model_call, conv_call, corpus_call = calls
    assert model_call["revision"] == SHA and model_call["patterns"] == ["*.json", "*.safetensors"]
    assert conv_call["repo_type"] == "dataset" and sorted(conv_call["written"]) == sorted(
        tq.CONVERSATION_FILES.values()
    )
    assert sorted(corpus_call["written"]) == [f"data/train-0000{i}-of-00002.parquet" for i in (0, 1)]
    passages, meta = read_frame(tmp_path / "raw" / "passages.parquet")
    assert list(passages.columns) == ["pid", "docid", "text"] and len(passages) == len(TITLES) * len(SECTIONS)
    assert passages["pid"].tolist() == list(range(len(passages)))
    assert meta["origin"]["corpus"] == {"hub": "org/wiki", "revision": SHA}
    turns, _ = read_frame(tmp_path / "raw" / "turns.parquet")
    assert (turns["split"] == "train").sum() == 16 and (turns["split"] == "test").sum() == 8
    first = turns[(turns["conv"] == "train1") & (turns["turn"] == 2)].iloc[0]
    record = conversation_records("train", 8, seed=5)[1]
    assert list(first["hist_queries"]) == [record["Context"][0]] and list(first["hist_responses"]) == [
        record["Context"][1]
    ]
    assert passages["docid"].iloc[int(first["gold_pid"])] == record["Gold_passage"]["id"]
    assert json.loads(Path(pj).read_text())["folder"].endswith(f"models/org--tiny-instruct/{SHA}")


def test_an_unpinned_revision_is_refused_with_the_pin_command_named(hub, tmp_path, monkeypatch):
    from paperflow.core import download

    calls, cache = hub
    monkeypatch.setattr(download, "read_lock_revisions", lambda slug, root=None: {})
    data = {**DATA, "corpus": {**DATA["corpus"], "revision": None}}
    with pytest.raises(
        UnpinnedDownload, match=r"data\.corpus\.revision .*dataset:org/wiki.*`paperflow pin dualreform`"
    ):
        paper.download_data({**data, "conversations": DATA["conversations"]}, str(cache), "p", "t")
    with pytest.raises(UnpinnedDownload, match=r"pretrained\.revision .*`paperflow pin dualreform`"):
        download_model(
            {**PRETRAINED, "revision": None},
            slug="dualreform",
            key="pretrained.revision",
            cache=str(cache),
            out=str(tmp_path / "p.json"),
        )
    with pytest.raises(ConfigError, match="not a pinned revision"):
        download_model(
            {**PRETRAINED, "revision": "main"},
            slug="dualreform",
            key="pretrained.revision",
            cache=str(cache),
            out=str(tmp_path / "p.json"),
        )
    assert [c["repo_type"] for c in calls] == ["dataset"]  # the conversations only: nothing after the refusal


def test_preprocess_saves_the_index_as_its_output_and_the_responses_references(hub, tmp_path):
    """No template candidates any more: the turns table holds each raw response's top passage and the single-role
    refiner's (response + question); the index is saved into the output folder, its marker written, and loads
    without the corpus to the same rankings as a fresh index."""
    _, table_path, marker = prepared(hub, tmp_path)
    table, meta = paper.read_table(table_path)
    assert meta["n_passages"] == len(TITLES) * len(SECTIONS) and "qcands" not in table and "q_top" not in table
    passages, _ = read_frame(tmp_path / "raw" / "passages.parquet")
    fresh = tq.CorpusBM25(passages["text"].tolist(), 0.9, 0.4)
    saved = paper.open_index(marker)
    assert Path(marker).exists() and saved.n_docs == len(passages) and saved.loaded
    assert table["r_raw_top1"].tolist() == fresh.top(table["response"].tolist(), 1)[:, 0].tolist()
    single = [f"{r} {q}" for r, q in zip(table["response"], table["query"])]
    assert table["r_single_top1"].tolist() == fresh.top(single, 1)[:, 0].tolist()
    assert table["r_single_top1"].tolist() != table["r_raw_top1"].tolist()  # the question changes some references
    queries = list(table["query"]) + single
    np.testing.assert_array_equal(saved.top(queries, 5), fresh.top(queries, 5))
    Path(marker).unlink()  # a save cut off before its marker: refused, not half-loaded
    with pytest.raises(FileNotFoundError, match="not a finished saved index"):
        paper.open_index(marker)
    texts = [f"{t} {sec}" for t in TITLES for sec in SECTIONS]
    queries = ["alpha music", "the gamma sport", "history of delta", "omega"]
    # the top passage of bm25s over the corpus is rank-bm25's BM25Okapi best on the same tokens (spec 10.3)
    from rank_bm25 import BM25Okapi

    okapi = BM25Okapi([t.split() for t in texts], k1=0.9, b=0.4)
    best = [int(np.argmax(okapi.get_scores([w for w in q.split() if w in TITLES + SECTIONS]))) for q in queries[:3]]
    index = tq.CorpusBM25(texts, 0.9, 0.4)
    top = index.top(queries, 3)
    assert top[:3, 0].tolist() == best and top.shape == (4, 3)
    assert {texts[p].split()[0] for p in top[3]} == {"omega"}  # the three omega passages tie on top


TINY_SPEC = {"arch": "qwen2", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1}
TINY_SPEC |= {"num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 16}


def _record_lora(monkeypatch, module, name: str) -> list:
    """The `lora` argument of every call of module.name."""
    import inspect

    seen: list = []
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        seen.append(inspect.signature(real).bind(*args, **kwargs).arguments["lora"])
        return real(*args, **kwargs)

    wrapped.__signature__ = inspect.signature(real)  # another recorder may wrap this one
    monkeypatch.setattr(module, name, wrapped)
    return seen


def _record_texts(monkeypatch, module, name: str, keys) -> list:
    """The arguments `keys` of every call of module.name, and what it returned ("out")."""
    import inspect

    seen: list = []
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        bound = inspect.signature(real).bind(*args, **kwargs).arguments
        seen.append({k: bound[k] for k in keys})
        seen[-1]["out"] = real(*args, **kwargs)
        return seen[-1]["out"]

    wrapped.__signature__ = inspect.signature(real)
    monkeypatch.setattr(module, name, wrapped)
    return seen


def test_the_paper_train_and_evaluate_path_runs_trl_with_lora_on_a_tiny_model(hub, tmp_path, monkeypatch):
    import bm25s

    from paperflow.dualreform import lora, writer

    # one implementation (issue 47): paper scale and the synthetic stages train through lora.train_sft / train_dpo
    sft_calls, dpo_calls = _record_lora(monkeypatch, lora, "train_sft"), _record_lora(monkeypatch, lora, "train_dpo")
    pj, table_path, marker = prepared(hub, tmp_path)
    samples = _record_texts(monkeypatch, writer, "sample_candidates", ("prompts", "k", "max_new_tokens"))
    sft_texts = _record_texts(monkeypatch, lora, "train_sft", ("prompts", "targets"))
    dpo_texts = _record_texts(monkeypatch, lora, "train_dpo", ("prompts", "chosen", "rejected"))
    ranked, real_top = [], tq.CorpusBM25.top
    monkeypatch.setattr(tq.CorpusBM25, "top", lambda self, q, k: ranked.append((list(q), k)) or real_top(self, q, k))
    builds, real_index = [], bm25s.BM25.index
    monkeypatch.setattr(bm25s.BM25, "index", lambda self, *a, **kw: builds.append(1) or real_index(self, *a, **kw))
    out = tmp_path / "models" / "dualreform"
    outputs = {
        "checkpoints": [str(out / f"seed{0}_it{i}.safetensors") for i in (1, 2)],
        "history": str(out / "history_seed0.csv"),
        "refs": str(out / "refs_seed0.parquet"),
    }
    history = paper.train("dualreform", 0, table_path, marker, pj, CFG, outputs)
    assert builds == []  # the index preprocess saved is loaded, not built again
    assert sft_calls == [CFG["lora"]] * 2 and dpo_calls == [CFG["lora"]] * 2  # LoRA adapters, one per stage and round
    # the candidates are the model's samples of each training query (its chat prompt), ranked by BM25 over the corpus
    table, _ = paper.read_table(table_path)
    train_turns = table[table["split"] == "train"].reset_index(drop=True)
    _, tok = paper._pretrained(pj, PRETRAINED, "cpu")
    prompts = lora.rewrite_prompts(tok, train_turns)
    assert [s["prompts"] for s in samples] == [prompts] and samples[0]["k"] == GEN["k"]
    cands = samples[0]["out"]
    assert all(1 <= len(c) <= GEN["k"] and len(set(c)) == len(c) for c in cands)
    assert ranked[0] == ([c for cs in cands for c in cs], 100)  # every sample ranked, to DEPTH
    of_prompt = dict(zip(prompts, cands))
    assert any(set(c) - set(train_turns["query"]) for c in cands)  # written by the model, not the question alone
    for call in sft_texts:
        assert call["targets"] and all(t in of_prompt[p] for p, t in zip(call["prompts"], call["targets"]))
    for call in dpo_texts:
        for p, c, r in zip(call["prompts"], call["chosen"], call["rejected"]):
            assert c in of_prompt[p] and r in of_prompt[p] and c != r
    # the dual role: each round's reference is BM25's top passage for the model's greedy refinement
    refs, meta = read_frame(outputs["refs"])
    assert sorted(set(refs["iteration"])) == [1, 2] and len(refs) == 2 * 16
    index = paper.open_index(marker)
    for it in (1, 2):
        r = refs[refs["iteration"] == it]
        assert r["ref"].tolist() == index.top(r["refined"].tolist(), 1)[:, 0].tolist()
    assert meta["generation"] == GEN
    from paperflow.core.lm.models import build_model
    from paperflow.dualreform import cqr, pipeline

    tok_tiny = cqr.make_tokenizer(["ka", "lo"])
    tiny = build_model({**TINY_SPEC, "vocab_size": len(tok_tiny)}, seed=0)
    prompt = cqr.prompt_text(cqr.rewrite_prompt([], "ka"))
    pipeline.fit_sft(tiny, tok_tiny, [prompt], ["lo"], {"epochs": 1, "batch_size": 1, "lr": 1e-3}, 0, "s")
    pipeline.fit_dpo(
        tiny, tok_tiny, [prompt], ["lo"], ["ka"], {"epochs": 1, "batch_size": 1, "lr": 1e-3, "beta": 0.1}, 0, "d"
    )
    assert sft_calls[2:] == [None] and dpo_calls[2:] == [None]  # the tiny model: full fine-tuning, same functions
    assert set(history["phase"]) == {f"dualreform it{i} {s}" for i in (1, 2) for s in ("sft", "dpo")}
    assert "rewards/accuracies" in history and history["loss"].notna().any()
    _, cache = hub
    dj, dindex = str(tmp_path / "models" / "dense.json"), str(tmp_path / "data" / "dense.npy")
    download_model(DENSE, slug="dualreform", key="dense.revision", cache=str(cache), out=dj)
    assert paper.index_dense(str(tmp_path / "raw" / "passages.parquet"), dj, DENSE, dindex) == (18, 384)
    dense = {"json": dj, "index": dindex, "settings": DENSE}
    rounds = {1: outputs["checkpoints"][0], 2: outputs["checkpoints"][1]}
    greedy = _record_texts(monkeypatch, writer, "greedy", ("prompts",))
    ranked.clear()
    evals = paper.evaluate("dualreform", 0, table_path, marker, pj, rounds, PRETRAINED, GEN, dense)
    assert evals["iteration"].tolist() == [1, 2] and evals["mrr"].between(0, 1).all()
    assert evals["dense_mrr"].between(0, 1).all() and evals["dense_recall@100"].eq(1.0).all()  # 18 passages
    test = table[table["split"] == "test"].reset_index(drop=True)
    assert [g["prompts"] for g in greedy] == [lora.rewrite_prompts(tok, test)] * 2  # each round rewrites greedily
    assert len(ranked) == 2 and ranked[0][0] != list(test["query"])  # BM25 ranks the model's rewrites
    raw = paper.evaluate("raw", 0, table_path, marker, None, {}, None, None)
    assert raw["share_unchanged"].iloc[0] == 1.0 and "dense_mrr" not in raw and len(greedy) == 2
    assert builds == []
    # the saved round, applied to the pretrained model again, gives the trained model's scores; the base's differ
    base, tok = paper._pretrained(pj, PRETRAINED, "cpu")
    prompts = lora.rewrite_prompts(tok, test)[:4]
    comps = [lora.completion(tok, c) for c in cands[0][:1] * 4]
    before = lora.completion_scores(base, tok, prompts, comps, 8, 256)
    tuned = lora.apply_round(paper._pretrained(pj, PRETRAINED, "cpu")[0], outputs["checkpoints"][1])
    after = lora.completion_scores(tuned, tok, prompts, comps, 8, 256)
    assert not np.allclose(before, after)
    again = lora.completion_scores(lora.apply_round(base, outputs["checkpoints"][1]), tok, prompts, comps, 8, 256)
    np.testing.assert_allclose(after, again, rtol=1e-6)


class Interrupted(RuntimeError):
    pass


def _count_steps(monkeypatch, stop_after: int | None = None) -> list[int]:
    """Every TRL run's optimizer steps (one entry per trainer), counted by a callback; with `stop_after`, the run is
    killed when that many steps (all trainers together) have finished and been saved (at the next step's start)."""
    from transformers import TrainerCallback

    from paperflow.dualreform import lora

    steps: list[int] = []
    fit = lora._fit

    class Count(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if stop_after is not None and sum(steps) >= stop_after:
                raise Interrupted(f"killed after {stop_after} steps")

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1] += 1

    def counted(trainer, every_s):
        steps.append(0)
        trainer.add_callback(Count())
        return fit(trainer, every_s)

    monkeypatch.setattr(lora, "_fit", counted)
    return steps


def _count_calls(monkeypatch, module, name: str, fail_at: int | None = None) -> list[int]:
    """Calls of module.name (a list that grows by one per call); the `fail_at`-th call raises Interrupted."""
    calls: list[int] = []
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        calls.append(1)
        if fail_at is not None and len(calls) == fail_at:
            raise Interrupted(f"{name}: call {fail_at}")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)
    return calls


def _train_outputs(folder: Path) -> dict:
    return {
        "checkpoints": [str(folder / f"seed0_it{i}.safetensors") for i in (1, 2)],
        "history": str(folder / "history_seed0.csv"),
        "refs": str(folder / "refs_seed0.parquet"),
    }


KILLS = ["the sampling, after two batches", "round 2's SFT, after a step", "round 1's DPO, at its start"]


@pytest.mark.parametrize("kill", [*KILLS, "round 2's refinement"])
def test_paper_training_killed_mid_job_resumes_from_its_checkpoint_folder_to_the_uninterrupted_result(
    hub, tmp_path, monkeypatch, kill
):
    """TRL resume (issue 43) and the sampling's row journal: a dualreform job killed part way reruns with the same
    checkpoint folder and does only the rest: the sampled batches in samples.jsonl are not sampled again, finished
    stages (references and refinements, SFT adapter, DPO round) are loaded, a trainer goes on from its last timed
    save, a stage's model or the refiner is rebuilt from saved adapters; it writes what a run without checkpoints
    writes (the rounds bit for bit, the history, the references)."""
    from safetensors.torch import load_file

    from paperflow.dualreform import writer

    monkeypatch.setattr(paper, "SAMPLE_BATCH", 5)  # 16 training turns: batches 0-4, 5-9, 10-14, 15
    cfg = {**CFG, "trl_sft": {**TRL, "per_device_train_batch_size": 2}}  # a few preference pairs: steps to resume
    pj, table_path, marker = prepared(hub, tmp_path)
    with monkeypatch.context() as m:
        steps = _count_steps(m)
        sampled, refined = _count_calls(m, writer, "sample_candidates"), _count_calls(m, writer, "greedy")
        want = _train_outputs(tmp_path / "plain")
        paper.train("dualreform", 0, table_path, marker, pj, cfg, want)
    sft1, dpo1, sft2, dpo2 = steps  # one trainer per stage and round
    assert sft2 >= 2 and len(sampled) == 4 and len(refined) == 2  # the refiner writes in each round
    stop, fail_sample, fail_refine, rest, rest_sampled, rest_refined = {
        "the sampling, after two batches": (None, 3, None, [sft1, dpo1, sft2, dpo2], 2, 2),
        "round 2's SFT, after a step": (sft1 + dpo1 + 1, None, None, [sft2 - 1, dpo2], 0, 0),
        "round 1's DPO, at its start": (sft1, None, None, [dpo1, sft2, dpo2], 0, 1),
        "round 2's refinement": (None, None, 2, [sft2, dpo2], 0, 1),  # the refiner: round 1's saved adapters
    }[kill]
    ckpt, got = tmp_path / "ckpt", _train_outputs(tmp_path / "resumed")
    with monkeypatch.context() as m:
        _count_steps(m, stop_after=stop)
        _count_calls(m, writer, "sample_candidates", fail_at=fail_sample)
        _count_calls(m, writer, "greedy", fail_at=fail_refine)
        with pytest.raises(Interrupted):
            paper.train("dualreform", 0, table_path, marker, pj, cfg, got, checkpoint=ckpt, every_s=0)
    journalled = [json.loads(line)["start"] for line in (ckpt / "samples.jsonl").read_text().splitlines()]
    assert journalled == ([0, 5] if fail_sample else [0, 5, 10, 15])
    with monkeypatch.context() as m:
        steps = _count_steps(m)
        sampled, refined = _count_calls(m, writer, "sample_candidates"), _count_calls(m, writer, "greedy")
        history = paper.train("dualreform", 0, table_path, marker, pj, cfg, got, checkpoint=ckpt, every_s=0)
    assert steps == rest and len(sampled) == rest_sampled and len(refined) == rest_refined  # only what was left
    for a, b in zip(want["checkpoints"], got["checkpoints"]):
        wa, wb = load_file(a), load_file(b)
        assert sorted(wa) == sorted(wb) and all(torch_equal(wa[k], wb[k]) for k in wa)
    assert Path(want["history"]).read_text() == Path(got["history"]).read_text()
    assert len(history) == sft1 + dpo1 + sft2 + dpo2  # a row per step, those of the first run's included
    pd.testing.assert_frame_equal(read_frame(want["refs"])[0], read_frame(got["refs"])[0])


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_paper_evaluation_killed_after_an_iteration_reruns_only_the_rest(hub, tmp_path, monkeypatch):
    """Row journal (issue 43): evaluate keeps each iteration's row in the job's journal; killed in iteration 2, the
    rerun writes only iteration 2's rewrites and returns what an uninterrupted evaluation returns."""
    from paperflow.dualreform import writer

    pj, table_path, marker = prepared(hub, tmp_path)
    outputs = _train_outputs(tmp_path / "models")
    cfg = {**CFG, "iterations": 1}
    paper.train("retpo", 0, table_path, marker, pj, cfg, {**outputs, "checkpoints": outputs["checkpoints"][:1]})
    rounds = {1: outputs["checkpoints"][0], 2: outputs["checkpoints"][0]}  # two units: the same round twice
    want = paper.evaluate("retpo", 0, table_path, marker, pj, rounds, PRETRAINED, GEN)
    journal = tmp_path / "ckpt" / "rows.jsonl"
    with monkeypatch.context() as m:
        _count_calls(m, writer, "greedy", fail_at=2)
        with pytest.raises(Interrupted):
            paper.evaluate("retpo", 0, table_path, marker, pj, rounds, PRETRAINED, GEN, journal=journal)
    assert len(journal.read_text().splitlines()) == 1
    with monkeypatch.context() as m:
        written = _count_calls(m, writer, "greedy")
        got = paper.evaluate("retpo", 0, table_path, marker, pj, rounds, PRETRAINED, GEN, journal=journal)
    assert len(written) == 1
    pd.testing.assert_frame_equal(want, got)


def test_the_dense_index_killed_mid_corpus_encodes_only_the_missing_chunks_on_rerun(tmp_path):
    """Row journal of chunks (issue 43): index_corpus with a checkpoint folder journals each flushed chunk; killed
    in chunk 3 of 5, the rerun encodes chunks 3-5 only and moves the same array to the output."""
    from paperflow.dualreform import dense as dn

    texts = [f"passage {i} " + "word " * (i % 5) for i in range(18)]
    calls: list[int] = []

    class Encoder:  # deterministic per text, like a sentence encoder in eval mode
        def __init__(self, fail_at=None):
            self.fail_at = fail_at

        def encode(self, batch, **_):
            calls.append(len(batch))
            if self.fail_at is not None and len(calls) == self.fail_at:
                raise Interrupted("encoder killed")
            return np.array([[len(t), sum(map(ord, t)) % 97, i % 3] for i, t in enumerate(batch)], dtype=np.float32)

    want = tmp_path / "plain.npy"
    assert dn.index_corpus(Encoder(), texts, 8, want, chunk=4) == (18, 3)
    ckpt, out = tmp_path / "ckpt", tmp_path / "dense.npy"
    calls.clear()
    with pytest.raises(Interrupted):
        dn.index_corpus(Encoder(fail_at=4), texts, 8, out, chunk=4, checkpoint=ckpt)  # the dim probe, chunks 1-2
    assert len((ckpt / "chunks.jsonl").read_text().splitlines()) == 2 and not out.exists()
    calls.clear()
    assert dn.index_corpus(Encoder(), texts, 8, out, chunk=4, checkpoint=ckpt) == (18, 3)
    assert calls == [4, 4, 2]  # chunks 3, 4 and 5 only
    np.testing.assert_array_equal(np.load(out), np.load(want))
    assert np.load(out).dtype == np.float16 and not (ckpt / "index.npy").exists()


def test_preprocess_killed_after_its_index_and_after_two_batches_reruns_without_rebuilding(hub, tmp_path, monkeypatch):
    """Saved index + row journal of retrieval batches (issue 43): preprocess with a checkpoint folder saves the bm25s
    index (and its Tokenizer's vocabulary) once built and journals the responses' retrieval in batches of turns.
    Killed first right after the index is saved, then after two of five batches, the reruns load the index (no second
    build) and retrieve only the batches left; the table is byte for byte the one a run without checkpoints writes,
    and the index is copied to the output folder, its marker last."""
    import bm25s

    _, cache = hub
    raw = {k: str(tmp_path / "raw" / f"{k}.parquet") for k in ("passages", "turns")}
    paper.download_data(DATA, str(cache), raw["passages"], raw["turns"])
    n_turns = len(read_frame(raw["turns"])[0])
    assert n_turns == 24
    monkeypatch.setattr(tq, "BATCH_TURNS", 5)  # batches of turns 0-4, 5-9, 10-14, 15-19, 20-23
    builds, retrieved, kill = [], [], {"at": None}
    real_index, real_scored = bm25s.BM25.index, tq.CorpusBM25.scored

    def index(self, *args, **kwargs):
        builds.append(1)
        return real_index(self, *args, **kwargs)

    def scored(self, queries, k):
        if kill["at"] is not None and len(retrieved) == kill["at"]:
            raise Interrupted(f"killed after {len(retrieved)} retrieval calls")
        retrieved.append(len(queries))
        return real_scored(self, queries, k)

    monkeypatch.setattr(bm25s.BM25, "index", index)
    monkeypatch.setattr(tq.CorpusBM25, "scored", scored)
    bm25 = {"k1": 0.9, "b": 0.4}
    want, want_index = tmp_path / "plain.parquet", tmp_path / "plain_index"
    paper.preprocess(raw["passages"], raw["turns"], bm25, 1, str(want), want_index)
    assert builds == [1] and retrieved == [n_turns, n_turns]  # one call per reference kind

    ckpt, out, out_index = tmp_path / "ckpt", tmp_path / "turns.parquet", tmp_path / "data" / "bm25_index"
    builds.clear(), retrieved.clear()
    kill["at"] = 0  # killed at the first retrieval: the index is built and saved
    with pytest.raises(Interrupted):
        paper.preprocess(raw["passages"], raw["turns"], bm25, 1, str(out), out_index, checkpoint=ckpt)
    assert builds == [1] and (ckpt / "bm25" / tq.INDEX_DONE).exists() and not out.exists()
    assert not (out_index / tq.INDEX_DONE).exists()  # the output's marker only once the job is done
    builds.clear()
    kill["at"] = 4  # two batches (a raw-response call and a single-role call each), then killed
    with pytest.raises(Interrupted):
        paper.preprocess(raw["passages"], raw["turns"], bm25, 1, str(out), out_index, checkpoint=ckpt)
    assert builds == [] and retrieved == [5, 5, 5, 5]
    rows = [json.loads(line) for line in (ckpt / "references.jsonl").read_text().splitlines()]
    assert [(r["start"], r["stop"]) for r in rows] == [(0, 5), (5, 10)] and len(rows[0]["r_single_top1"]) == 5
    builds.clear(), retrieved.clear()
    kill["at"] = None
    table = paper.preprocess(raw["passages"], raw["turns"], bm25, 1, str(out), out_index, checkpoint=ckpt)
    assert builds == [] and retrieved == [5, 5, 5, 5, 4, 4]  # batches 3-5 only, on the loaded index
    assert len(table) == n_turns and out.read_bytes() == want.read_bytes()
    assert sorted(f.name for f in out_index.iterdir()) == sorted(f.name for f in want_index.iterdir())
    queries = list(table["query"])
    np.testing.assert_array_equal(
        paper.open_index(out_index).top(queries, 5), paper.open_index(want_index).top(queries, 5)
    )


def test_dense_search_in_chunks_is_exact_and_breaks_ties_by_pid(tmp_path):
    from paperflow.dualreform import dense as dn

    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(50, 8))
    corpus = (corpus / np.linalg.norm(corpus, axis=1, keepdims=True)).astype(np.float16)  # unit rows, as GTR's
    corpus[7] = corpus[3]  # a tie: the lower pid first
    np.save(tmp_path / "c.npy", corpus)
    queries = rng.normal(size=(5, 8)).astype(np.float16)
    queries[0] = corpus[3]
    got = dn.top(tmp_path / "c.npy", queries, 10, "cpu", chunk=7)
    scores = queries.astype(np.float32) @ corpus.astype(np.float32).T
    want = np.stack([np.lexsort((np.arange(50), -row))[:10] for row in scores])
    np.testing.assert_array_equal(got, want)
    assert got[0, 0] == 3 and got[0, 1] == 7
    assert dn.gold_ranks(got, np.array([7, got[1, 4], 49, 0, 1]))[:2].tolist() == [2, 5]
    assert dn.gold_ranks(got[:1], np.array([int(np.argmin(scores[0]))]))[0] == 11


def _evals(mrr: dict[str, float], seeds=(0, 1)) -> pd.DataFrame:
    rows = []
    for m, v in mrr.items():
        its = (1, 2) if m == "dualreform" else ((0,) if m in ("raw", "prompted") else (1,))
        for s in seeds:
            for it in its:
                rows.append(
                    {
                        "method": m,
                        "seed": s,
                        "iteration": it,
                        "mrr": v + 0.01 * s,
                        "ndcg@3": v,
                        "recall@10": v,
                        "recall@100": v,
                    }
                )
    return pd.DataFrame(rows)


def _refs(hit: float, n=20, seeds=(0, 1)) -> pd.DataFrame:
    k = int(hit * n)
    return pd.concat(
        [
            pd.DataFrame(
                {"iteration": it, "turn_index": np.arange(n), "ref": [1] * k + [2] * (n - k), "gold": 1, "seed": s}
            )
            for s in seeds
            for it in (1, 2)
        ],
        ignore_index=True,
    )


def _train_table(raw_hit: float, n=20) -> pd.DataFrame:
    """n training turns whose raw response retrieves passage 1 (the references' gold) for the first raw_hit * n."""
    k = int(raw_hit * n)
    return pd.DataFrame({"split": "train", "r_raw_top1": [1] * k + [2] * (n - k), "gold_pid": 1})


def _paper_verdicts(mrr, hit, raw_hit=0.5):
    from paperflow.core.claims import judge_all, parse_claims
    from paperflow.dualreform.claims import metrics_table

    refs = {m: _refs(hit) for m in ("retpo", "dualreform", "single_role", "random_ref")}
    frame = metrics_table(_evals(mrr), refs, _train_table(raw_hit), 2, "topiocqa", "paper")
    specs = parse_claims(load_paper_config("dualreform", "paper")["claims"], "config/dualreform.yaml")
    return {v.id: v for v in judge_all(specs, frame, "paper")}


def test_paper_claims_hold_on_an_effect_and_fail_on_their_negative_control():
    mrr = {"raw": 0.10, "prompted": 0.15, "retpo": 0.40, "dualreform": 0.38, "single_role": 0.30, "random_ref": 0.12}
    found = _paper_verdicts(mrr, 0.8)
    assert {k: v.verdict for k, v in found.items()} == dict.fromkeys(found, "held") and len(found) == 5
    assert not any(v.gated for v in found.values())
    # negative control: the raw question's and the prompted model's MRR in DualReform's place, raw-level references,
    # and random references that beat the model they start from
    control = {**mrr, "dualreform": 0.10, "random_ref": 0.30}
    found = _paper_verdicts(control, 0.5)
    assert not any(v.held for v in found.values()), {k: v.verdict for k, v in found.items()}


def test_the_paper_report_builds_from_the_rules_frames(tmp_path):
    from paperflow.core.report import publish
    from paperflow.dualreform.paper_report import build_report

    cfg = load_paper_config("dualreform", "paper")
    mrr = {"raw": 0.1, "prompted": 0.15, "retpo": 0.4, "dualreform": 0.38, "single_role": 0.3, "random_ref": 0.12}
    refs = {m: _refs(0.8) for m in ("retpo", "dualreform", "single_role", "random_ref")}
    params = {"seeds": [0, 1], "methods": list(mrr), "iterations": 2, "pretrained": cfg["pretrained"], "scale": "paper"}
    report = build_report(_evals(mrr), refs, _train_table(0.5), params)
    outputs = {
        k: str(tmp_path / f)
        for k, f in (
            ("report", "report.md"),
            ("metrics", "metrics.json"),
            ("metrics_table", "metrics.parquet"),
            ("table_retrieval", "t.csv"),
            ("figure_mrr", "mrr.png"),
        )
    }
    doc = publish(report, outputs, paper="dualreform", scale="paper", claims=cfg["claims"])
    assert [c["id"] for c in doc["claims"]][0] == "paper_g1_refined_refs_beat_raw_by_10pts"
    assert doc["claims"][0]["value"] == pytest.approx(0.8 - 0.5) and doc["claims"][0]["unit"] == "seed"
    assert "meta-llama/Llama-3.1-8B-Instruct" in Path(outputs["report"]).read_text()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("  source: {kind: topiocqa}", "  source: {kind: qrecc}"), "qrecc.*not wired"),
        (
            ("methods: [raw, prompted, retpo,", "methods: [raw, sft_human, prompted, retpo,"),
            r"\['sft_human'\] do not run",
        ),
        (("methods: [raw, prompted, retpo,", "methods: [raw, retpo,"), "add 'prompted'"),
        (("    loss_type: sigmoid\n", "    loss_type: sigmoid\n    warmup_ratio: 0.1\n"), "warmup_ratio"),
        (("revision: 50ae3b82713b1a935190def03ce7e7e75a318636", "revision: main"), "revision"),
        (("    dtype: bfloat16 ", "    dtype: bf16 "), "dtype"),
        (("    quantization: 4bit ", "    quantization: 8bit "), "quantization"),
    ],
)
def test_paper_config_errors_name_the_key(repo_copy, edit, message):
    path = repo_copy / "config" / "dualreform.yaml"
    text = path.read_text()
    assert edit[0] in text
    path.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("dualreform", "paper", repo_copy)


def test_prompted_needs_the_paper_scale(repo_copy):
    path = repo_copy / "config" / "dualreform.yaml"
    text = path.read_text()
    path.write_text(text.replace("  methods: [raw, sft_human, retpo,", "  methods: [raw, prompted, sft_human, retpo,"))
    with pytest.raises(ConfigError, match="'prompted' needs a pretrained model"):
        load_paper_config("dualreform", "smoke", repo_copy)


def test_paper_scale_dry_run_builds_the_dag_with_gpus_on_train_evaluate_and_dense_index_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[dualreform]")
    cfg = load_paper_config("dualreform", "paper")
    n_seeds = len(cfg["seeds"])
    counts = dict(re.findall(r"^(dualreform_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts == {
        "dualreform_download_model": "1",
        "dualreform_download": "1",
        "dualreform_preprocess": "1",
        "dualreform_train": str(3 * n_seeds),
        "dualreform_train_iterated": str(n_seeds),
        "dualreform_evaluate": str(6 * n_seeds),
        "dualreform_download_dense": "1",
        "dualreform_index_dense": "1",
        "dualreform_report": "1",
    }
    gpus = {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
    heavy = ("dualreform_train", "dualreform_train_iterated", "dualreform_evaluate", "dualreform_index_dense")
    assert all(gpus[r] == {1} for r in heavy)
    assert all(v == {0} for r, v in gpus.items() if r not in heavy)
    # the BM25 index is preprocess's output (its marker, written last) and an input of every train and evaluate job
    marker = f"results/paper/dualreform/data/bm25_index/{tq.INDEX_DONE}"
    blocks = re.findall(r"^rule (dualreform_\w+):\n    input: (.*)\n    output: (.*)$", proc.stdout, re.M)
    users = [rule for rule, inputs, _ in blocks if marker in inputs.split(", ")]
    makers = [rule for rule, _, outputs in blocks if marker in outputs.split(", ")]
    assert makers == ["dualreform_preprocess"]
    assert sorted(set(users)) == ["dualreform_evaluate", "dualreform_train", "dualreform_train_iterated"]
    assert len(users) == 3 * n_seeds + n_seeds + 6 * n_seeds  # every train and evaluate job


def test_qlora_loads_the_paper_model_in_4_bits_on_cuda_only_and_prepares_it_for_adapters(hub, tmp_path, monkeypatch):
    """pretrained.quantization 4bit: NF4 weights through bitsandbytes (a CUDA device), PEFT's k-bit preparation before
    the LoRA trainers; refused by name on the CPU and for an unknown value (the 4-bit load itself needs a GPU)."""
    import torch
    import transformers

    from paperflow.core.config import ConfigError
    from paperflow.dualreform import lora

    pj, _, _ = prepared(hub, tmp_path)
    with pytest.raises(ConfigError, match="pretrained.quantization 4bit needs a CUDA device"):
        paper._model(pj, {**PRETRAINED, "quantization": "4bit"}, torch.device("cpu"))
    with pytest.raises(ConfigError, match="pretrained.quantization '8bit'.*allowed values: null, 4bit"):
        paper._model(pj, {**PRETRAINED, "quantization": "8bit"}, torch.device("cpu"))
    seen = {}

    def fake_load(folder, **kwargs):
        seen.update(folder=folder, **kwargs)
        return torch.nn.Linear(1, 1)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(fake_load))
    paper._model(pj, {**PRETRAINED, "quantization": "4bit", "dtype": "bfloat16"}, torch.device("cuda", 1))
    q = seen["quantization_config"]
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_compute_dtype == torch.bfloat16
    assert seen["device_map"] == {"": 1} and seen["local_files_only"]
    prepared_models = []
    monkeypatch.setattr("peft.prepare_model_for_kbit_training", lambda m, **kw: prepared_models.append(kw) or m)
    plain, four_bit = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)
    four_bit.is_loaded_in_4bit = True
    assert lora._kbit_ready(plain, {"r": 1}) is plain and lora._kbit_ready(four_bit, None) is four_bit
    assert prepared_models == []
    assert lora._kbit_ready(four_bit, {"r": 1}) is four_bit and prepared_models == [
        {"use_gradient_checkpointing": False}
    ]
