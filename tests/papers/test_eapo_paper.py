"""eapo at paper scale, offline: Hub files in the publishers' layouts (DAPO-Math-17k's nested parquet columns,
MATH-500's jsonl, AIME 2024's parquet shard) fetched only at the pinned commit, an unpinned one refused with
`paperflow pin eapo` named; the reward rule (the last \\boxed{}, math-verify gold first, no fallback); a tiny
Qwen2 and a word-level tokenizer through TRL's GRPOTrainer with EAPO's sampler (pi_E, EAPO with the behaviour
log-probs as TRL's old log-probs, alpha = 0 equal to GRPO weight for weight), avg@k and the report on the CPU;
config errors by name; the paper DAG with GPUs on train and evaluate only.

math-verify is not installed here: the reward's wiring is tested against a fake module that records its calls
(`fake_math_verify`), and the real library's equivalences are checked only where it is installed."""

from __future__ import annotations

import copy
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fake_hub import FakeHub, install

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import PIN_ENV, UnpinnedDownload
from paperflow.core.hub_download import download_model
from paperflow.core.io import read_frame
from paperflow.eapo import math_data, paper, paper_train
from paperflow.eapo.math_reward import last_boxed, math_reward, trl_math_reward

SHA = "0123456789abcdef0123456789abcdef01234567"
DAPO_PREFIX = "Solve it.\n\n"
DAPO_SUFFIX = "\n\nAnswer: last."
ANSWERS = ["2", "3", "4"]
BOXES = [f"\\boxed{{{a}}}" for a in ANSWERS]
MODEL_SPEC = {  # llama: transformers 5 loads a word-level tokenizer beside a qwen2 config as Qwen2's BPE tokenizer
    "arch": "llama",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 32,
}


# --- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_math_verify(monkeypatch):
    """A stand-in for the math_verify package: parse strips the $...$, verify compares strings; calls recorded."""
    calls = []
    mod = types.ModuleType("math_verify")

    def parse(text):
        calls.append(("parse", text))
        return [text.strip("$")]

    def verify(gold, guess):
        calls.append(("verify", gold, guess))
        return gold == guess

    mod.parse, mod.verify = parse, verify
    monkeypatch.setitem(sys.modules, "math_verify", mod)
    return calls


def _problems(n, seed):
    rng = np.random.default_rng(seed)
    pairs = [(int(a), int(b)) for a, b in rng.integers(1, 3, (n, 2))]
    return [f"{a} + {b}" for a, b in pairs], [str(a + b) for a, b in pairs]


def hub_files() -> dict[str, dict[str, pd.DataFrame]]:
    """{repo: {path: frame}} in the publishers' layouts and columns."""
    text, answer = _problems(6, 0)
    dapo = pd.DataFrame(
        {
            "data_source": "math_dapo",
            "prompt": [[{"content": DAPO_PREFIX + t + DAPO_SUFFIX, "role": "user"}] for t in text * 3],  # repeats
            "ability": "MATH",
            "reward_model": [{"ground_truth": a, "style": "rule-lapse"} for a in answer * 3],
            "extra_info": [{"index": f"id{i}"} for i in range(18)],
        }
    )
    t5, a5 = _problems(4, 1)
    math500 = pd.DataFrame({"problem": t5, "solution": ["..."] * 4, "answer": a5, "subject": "Algebra", "level": 1})
    t24, a24 = _problems(3, 2)
    aime = pd.DataFrame({"id": range(3), "problem": t24, "solution": "...", "answer": a24, "url": "u", "year": "2024"})
    return {
        "BytedTsinghua-SIA/DAPO-Math-17k": {"data/dapo-math-17k.parquet": dapo, "README.md": b"card"},
        "HuggingFaceH4/MATH-500": {"test.jsonl": math500, "README.md": b"card"},
        "HuggingFaceH4/aime_2024": {"data/train-00000-of-00001.parquet": aime, "README.md": b"card"},
    }


def tokenizer():
    from paperflow.core.lm.tokenizer import word_level_tokenizer

    return word_level_tokenizer(["Q:", "A:", "+", "1", "2", "3", "4", "so", *BOXES])


def paper_cfg():
    """The paper block with the three fixture datasets and tiny sizes (TRL's layout: 4 rows = 1 prompt x G 4)."""
    cfg = copy.deepcopy(load_paper_config("eapo", "paper"))
    datasets = cfg["math"]["datasets"]
    datasets["dapo17k"].update(revision=SHA, strip_prefix=DAPO_PREFIX, strip_suffix=DAPO_SUFFIX)
    datasets["aime24"]["revision"] = SHA
    cfg["math"]["datasets"] = {k: datasets[k] for k in ("dapo17k", "math500", "aime24")}
    cfg["math"].update(
        prompt_template="Q: {problem} A:",
        max_prompt_length=6,
        benchmarks=["math500", "aime24"],
        rollout={"batch_rows": 4, "stop_tokens": []},
        evaluation={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 3, "batch_size": 8, "seed": 0},
    )
    cfg["math"]["datasets"]["aime24"]["k"] = 2
    cfg["math"]["datasets"]["math500"]["k"] = 2
    cfg["math"]["trl"].update(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_completion_length=3,
        bf16=False,
        gradient_checkpointing=False,
    )
    cfg["rl"].update(steps=1, prompts_per_step=1, group_size=4, lr=0.05)
    cfg["eapo"].update(g_aug=2, alpha=1.0, quantile=0.3)
    cfg["pretrained"].update(revision=SHA, dtype="float32", device="cpu")
    cfg["resources"].update(train_gpus=1)
    return cfg


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """download_pretrained replaced by a fake Hub: dataset repos lay out `hub_files()` (only the files the patterns
    ask for), the model repo a tiny Qwen2 (kit `save_model`) and its tokenizer. Returns the recorded calls."""
    from paperflow.core.lm.models import build_model, save_model
    from paperflow.core.lm.tokenizer import save_tokenizer

    tok = tokenizer()

    def model(folder):
        save_model(build_model({**MODEL_SPEC, "vocab_size": len(tok)}, seed=0), folder)
        save_tokenizer(tok, folder)

    return install(monkeypatch, FakeHub(hub_files(), model=model)).calls


@pytest.fixture
def prepared(hub, tmp_path):
    """Model and datasets downloaded and preprocessed: (cfg, pretrained.json, {dataset: data parquet})."""
    cfg = paper_cfg()
    cache = tmp_path / "cache"
    pretrained = tmp_path / "models" / "pretrained.json"
    download_model(cfg["pretrained"], slug="eapo", key="pretrained.revision", cache=str(cache), out=str(pretrained))
    data = {}
    for name, spec in cfg["math"]["datasets"].items():
        raw = tmp_path / "raw" / f"{name}.parquet"
        paper.download_dataset(name, spec, str(cache), str(raw))
        data[name] = tmp_path / "data" / f"{name}.parquet"
        paper.preprocess(name, str(raw), str(pretrained), cfg["math"]["prompt_template"], 6, str(data[name]))
    return cfg, pretrained, data


def _spec(cfg, prepared_data, tmp_path, method, start, prior=None, seed=0):
    out = tmp_path / "runs" / method
    spec = paper.train_spec(
        cfg,
        method,
        seed,
        start,
        prior,
        str(prepared_data["dapo17k"]),
        str(out),
        str(out) + "_history.csv",
        str(out) + "_rollouts.csv",
        processes=1,
    )
    json.dumps(spec)  # it crosses the torchrun boundary as a file
    return spec


# --- the reward -------------------------------------------------------------------------------------------------
def test_last_boxed_takes_the_last_box_with_nested_braces():
    assert last_boxed("so \\boxed{1} then \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{7} and \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed 5$ end") == "5"
    assert last_boxed("no box here") is None
    assert last_boxed("\\boxed{1} and \\boxed{2") is None  # the last box never closes


def test_the_reward_calls_math_verify_gold_first_on_the_last_box(fake_math_verify):
    assert math_reward("work \\boxed{2} then \\boxed{3}", "3") == 1.0
    assert fake_math_verify == [("parse", "$3$"), ("parse", "$3$"), ("verify", ["3"], ["3"])]
    assert math_reward("\\boxed{4}", "3") == 0.0
    before = len(fake_math_verify)
    assert math_reward("the answer is 3", "3") == 0.0  # no box: 0, math-verify not asked
    assert len(fake_math_verify) == before
    assert trl_math_reward(["p", "p"], ["\\boxed{3}", "x"], answer=["3", "3"]) == [1.0, 0.0]


def test_without_math_verify_the_reward_refuses_instead_of_falling_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)
    with pytest.raises(ImportError, match="math-verify==0.9.0"):
        math_reward("\\boxed{3}", "3")


def test_the_real_math_verify_agrees_on_equivalent_forms():
    pytest.importorskip(
        "math_verify", reason="math-verify is not installed in this env (the paper-scale env needs it; README)"
    )
    assert math_reward("so \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert math_reward("so \\boxed{3}", "4") == 0.0
    assert math_reward("thus \\boxed{\\dfrac{14}{3}}.", "\\frac{14}{3}") == 1.0
    assert math_reward("\\boxed{2} wait, \\boxed{204}", "204") == 1.0  # the last box counts


# --- downloads and preprocessing --------------------------------------------------------------------------------
def test_downloads_ask_only_for_the_configured_files_at_the_pinned_commit(prepared, hub):
    cfg, pretrained, data = prepared
    by_repo = {c["name"]: c for c in hub}
    assert by_repo["Qwen/Qwen2.5-Math-7B"]["patterns"] == cfg["pretrained"]["files"]
    for spec in cfg["math"]["datasets"].values():
        call = by_repo[spec["hub"]]
        assert call["repo_type"] == "dataset" and call["patterns"] == spec["files"]
        assert call["revision"] == (spec["revision"] or SHA)
        assert "README.md" not in call["written"] and call["written"]
    assert by_repo["HuggingFaceH4/MATH-500"]["revision"] == "ff5b20257d8185524591543f8ff5993951537bb8"
    assert json.loads(pretrained.read_text())["revision"] == SHA


def test_an_unpinned_download_is_refused_with_the_pin_command_named(hub, tmp_path, monkeypatch):
    monkeypatch.delenv(PIN_ENV, raising=False)
    monkeypatch.setattr("paperflow.core.download.lock_path", lambda slug, root=None: tmp_path / "none.json")
    cfg = paper_cfg()
    spec = {**cfg["math"]["datasets"]["aime24"], "revision": None}
    with pytest.raises(UnpinnedDownload, match="paperflow pin eapo"):
        paper.download_dataset("aime24", spec, str(tmp_path / "c"), str(tmp_path / "raw.parquet"))
    with pytest.raises(UnpinnedDownload, match="pretrained.revision"):
        download_model(
            {**cfg["pretrained"], "revision": None},
            slug="eapo",
            key="pretrained.revision",
            cache=str(tmp_path / "c"),
            out=str(tmp_path / "m.json"),
        )
    assert hub == []


def test_preprocess_strips_dapos_instruction_dedupes_and_renders_the_template(prepared):
    cfg, _, data = prepared
    train, meta = read_frame(data["dapo17k"])
    text, answer = _problems(6, 0)
    unique = dict(zip(text, answer))
    assert sorted(train["problem"]) == sorted(unique) and len(train) == len(unique)  # 18 rows, 6 problems
    assert all(unique[p] == a for p, a in zip(train["problem"], train["answer"]))
    assert all(pr == f"Q: {p} A:" for p, pr in zip(train["problem"], train["prompt"]))
    assert meta["revision"] == SHA and meta["dropped"] == 0
    bench, _ = read_frame(data["math500"])
    assert list(bench["problem_id"]) == [0, 1, 2, 3]


def test_a_wrong_layout_is_refused_by_its_key():
    frame = pd.DataFrame({"prompt": [[{"content": "x"}]], "reward_model": [{"ground_truth": "1"}]})
    spec = {"problem": "prompt.0.text", "answer": "reward_model.ground_truth"}
    with pytest.raises(ConfigError, match=r"math.datasets.t.problem = 'prompt.0.text': no field 'text'"):
        math_data.problems(frame, spec, "math.datasets.t")
    with pytest.raises(ValueError, match="strip_prefix: 1 of 1"):
        math_data.problems(frame, {**spec, "problem": "prompt.0.content", "strip_prefix": "Solve"}, "k")
    with pytest.raises(ConfigError, match="no column 'question'"):
        math_data.problems(frame, {**spec, "problem": "question"}, "k")
    with pytest.raises(ConfigError, match=r"stop_tokens \['<\|im_end\|>'\]"):
        math_data.stop_ids(tokenizer(), ["<|im_end|>"])
    assert math_data.stop_ids(tokenizer(), ["so"]) == sorted({tokenizer().eos_token_id, tokenizer().get_vocab()["so"]})


def test_long_prompts_are_dropped_not_cut(prepared, tmp_path):
    cfg, pretrained, _ = prepared
    raw = tmp_path / "raw" / "math500.parquet"
    out = tmp_path / "short.parquet"
    kept = paper.preprocess("math500", str(raw), str(pretrained), "Q: {problem} A: so so", 6, str(out))
    frame, meta = read_frame(out)
    assert kept == 0 and meta["dropped"] == 4 and frame.empty


# --- training with TRL and EAPO's sampler -------------------------------------------------------------------------
def test_train_evaluate_report_run_end_to_end_on_a_tiny_model(prepared, tmp_path, fake_math_verify):
    cfg, pretrained, data = prepared
    base = paper.model_folder(str(pretrained))
    prior_spec = _spec(cfg, data, tmp_path, "grpo", base, seed=100)
    paper_train.run(prior_spec)
    spec = _spec(cfg, data, tmp_path, "eapo", base, prior=prior_spec["out_dir"])
    paper_train.run(spec)
    rollouts = pd.read_csv(spec["rollouts"])
    history = pd.read_csv(spec["history"])
    assert len(history) == cfg["rl"]["steps"] and "reward" in history
    assert (rollouts["injection_rate"] > 0).all() and (rollouts["critical_rate"] >= rollouts["injection_rate"]).all()
    assert (pd.read_csv(prior_spec["rollouts"])["injection_rate"] == 0).all()  # GRPO: the hook never runs
    evals = {}
    for method, folder in (("grpo", prior_spec["out_dir"]), ("eapo", spec["out_dir"])):
        pointer = tmp_path / f"{method}.json"
        pointer.write_text(json.dumps({"folder": folder}))
        frame = paper.evaluate(
            str(pointer),
            {b: str(data[b]) for b in cfg["math"]["benchmarks"]},
            {b: cfg["math"]["datasets"][b]["k"] for b in cfg["math"]["benchmarks"]},
            cfg["math"]["evaluation"],
            "cpu",
            "float32",
            stop_tokens=["so"],
        )
        assert set(frame["benchmark"]) == {"math500", "aime24"} and (frame["k"] == 2).all()
        assert frame["correct"].between(0, 2).all()
        evals[(method, 0)] = str(tmp_path / f"eval_{method}.parquet")
        from paperflow.core.io import write_frame

        write_frame(evals[(method, 0)], frame)
    table = paper.avg_at_k_table(evals, cfg["math"]["benchmarks"])
    doc = paper.report(table, {"math500": 2, "aime24": 2}, cfg["pretrained"], str(tmp_path / "report.md"))
    claim = next(c for c in doc["claims"] if c["id"] == "eapo_over_grpo_average")
    average = table.set_index("method")["average"]  # the claim is eapo's average minus grpo's
    assert claim["gated"] and np.isclose(claim["value"], average["eapo"] - average["grpo"])
    assert "avg@k" in (tmp_path / "report.md").read_text()


def _recording(trainer):
    """Wrap the trainer's generation step and its rollout's hand-over: [(rollout record, TRL batch)]."""
    seen, taken = [], []
    take = trainer.eapo_rollout.take

    def take_and_keep():
        last = take()
        taken.append(last)
        return last

    trainer.eapo_rollout.take = take_and_keep
    original = trainer._generate_and_score_completions

    def generate(inputs):
        out = original(inputs)
        seen.append((taken[-1], {k: v.clone() if torch.is_tensor(v) else v for k, v in out.items()}))
        return out

    trainer._generate_and_score_completions = generate
    return seen


def test_eapo_gives_trl_the_behaviour_log_probs_at_critical_steps(prepared, tmp_path, fake_math_verify):
    cfg, pretrained, data = prepared
    base = paper.model_folder(str(pretrained))
    trainer = paper_train.build(_spec(cfg, data, tmp_path, "eapo", base, prior=base))
    seen = _recording(trainer)
    trainer.train()
    last, out = seen[0]
    critical = paper_train._pad(last["critical"], out["completion_ids"].shape[1], False, "cpu")
    mu = paper_train._pad(last["logprobs"], out["completion_ids"].shape[1], 0.0, "cpu")
    assert critical.any() and torch.equal(out["old_per_token_logps"][critical], mu[critical])
    noisy = paper_train.build(_spec(cfg, data, tmp_path, "eapo_noIS", base, prior=base))
    seen = _recording(noisy)
    noisy.train()
    assert "old_per_token_logps" not in seen[0][1]  # noIS: TRL's own pi_old (its default), nothing replaced


def test_alpha_zero_trains_exactly_like_grpo(prepared, tmp_path, fake_math_verify):
    cfg, pretrained, data = prepared
    base = paper.model_folder(str(pretrained))
    cfg["eapo"]["alpha"] = 0.0
    weights = {}
    for method, prior in (("grpo", None), ("eapo", base)):
        trainer = paper_train.build(_spec(cfg, data, tmp_path, method, base, prior=prior, seed=100))
        trainer.train()
        assert trainer.state.log_history[0]["reward_std"] > 0  # a step with an advantage (seed 100's draws)
        weights[method] = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    start = paper_train._load(base, "float32").state_dict()
    assert any(not torch.equal(weights["grpo"][k], start[k]) for k in start)  # the step changed the model
    assert all(torch.equal(weights["grpo"][k], weights["eapo"][k]) for k in weights["grpo"])


def test_a_gpu_device_without_a_gpu_fails_naming_the_key(prepared, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    cfg, pretrained, data = prepared
    spec = {**_spec(cfg, data, tmp_path, "grpo", paper.model_folder(str(pretrained))), "device": "cuda"}
    with pytest.raises(ConfigError, match="pretrained.device = 'cuda'"):
        paper_train.build(spec)


def test_the_launch_runs_one_process_per_gpu_under_torchrun(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(paper.subprocess, "run", lambda cmd, check, env: ran.append((cmd, env)))
    cmd = paper.launch({"method": "eapo"}, str(tmp_path / "s.json"), 8, python="python")
    assert cmd == [
        "python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=8",
        "-m",
        "paperflow.eapo.paper_train",
        str(tmp_path / "s.json"),
    ]
    assert json.loads((tmp_path / "s.json").read_text()) == {"method": "eapo"}
    assert str(Path(paper.__file__).resolve().parents[2]) in ran[0][1]["PYTHONPATH"].split(":")
    assert paper.launch({}, str(tmp_path / "t.json"), 1, python="python")[:3] == [
        "python",
        "-m",
        "paperflow.eapo.paper_train",
    ]


# --- config, claims and the DAG ---------------------------------------------------------------------------------
def test_paper_claim_fails_on_its_negative_control():
    table = pd.DataFrame({"method": ["grpo", "eapo"], "seed": [0, 0], "average": [0.30, 0.35]})
    assert next(c for c in paper.claims(table) if c["id"] == "eapo_over_grpo_average")["held"]
    control = table.assign(average=[0.30, 0.30])  # EAPO no better than GRPO
    assert not next(c for c in paper.claims(control) if c["id"] == "eapo_over_grpo_average")["held"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["methods"].append("sft"), "'sft' is not a paper-scale method"),
        (lambda c: c["math"].update(benchmarks=["aime26"]), "'aime26' is not in math.datasets"),
        (lambda c: c["math"].update(prompt_template="Q: A:"), r"math.prompt_template must contain '\{problem\}'"),
        (lambda c: c["eapo"].update(critical_rule="kl"), "critical_rule 'entropy'"),
        (lambda c: c["math"]["trl"].update(gradient_accumulation_steps=4), "rl.prompts_per_step x rl.group_size"),
        (lambda c: c["math"]["datasets"]["math500"].pop("k"), r"math.datasets.math500.k"),
    ],
)
def test_paper_config_errors_name_the_key(edit, message):
    cfg = copy.deepcopy(load_paper_config("eapo", "paper"))
    paper.check(cfg)
    edit(cfg)
    with pytest.raises(ConfigError, match=message):
        paper.check(cfg)


def test_paper_scale_dry_run_puts_gpus_on_train_and_evaluate_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[eapo]")
    cfg = load_paper_config("eapo", "paper")
    runs = len(cfg["methods"]) * len(cfg["seeds"])
    seeds = str(len(cfg["seeds"]))
    trl_runs = len([m for m in cfg["methods"] if m not in ("dapo", "luffy")]) * len(cfg["seeds"])
    counts = dict(re.findall(r"^(eapo_\w+)\s+(\d+)$", proc.stdout, re.M))
    n_data = len(cfg["math"]["datasets"])
    assert counts == {
        "eapo_download_model": "1",
        "eapo_download": str(n_data),
        "eapo_preprocess": str(n_data),
        "eapo_train_prior": "1",
        "eapo_train": str(trl_runs),
        "eapo_evaluate": str(runs),
        "eapo_report": "1",
        # dapo and luffy: their authors' verl recipes (test_eapo_recipes.py)
        "eapo_download_recipes": "1",
        "eapo_recipe_data": "1",
        "eapo_prior_traces": "1",
        "eapo_luffy_data": "1",
        "eapo_train_dapo": seeds,
        "eapo_train_luffy": seeds,
    }
    gpus, nodes = {}, {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
        nodes.setdefault(job.rule, set()).add(job.resources.get("nodes"))
    res = cfg["resources"]
    trains = ("eapo_train_prior", "eapo_train", "eapo_train_dapo", "eapo_train_luffy")
    assert all(gpus[r] == {res["train_gpus"]} for r in trains), gpus
    assert all(nodes[r] == {"1"} for r in trains[1:])  # one node, its GPUs (train_node_gpu)
    assert gpus["eapo_evaluate"] == gpus["eapo_prior_traces"] == {res["evaluate_gpus"]}
    heavy = (*trains, "eapo_evaluate", "eapo_prior_traces")
    assert all(v == {0} for r, v in gpus.items() if r not in heavy)
    # issue 44: the unsharded 7B layout needs ~141 GB cards, so every GPU job names the card model, no CPU job does
    jobs = parse_dry_run(proc.stdout)
    assert res["gpu_model"] and {j.resources.get("gpu_model") for j in jobs if j.gpus} == {res["gpu_model"]}
    assert {j.resources.get("gpu_model") for j in jobs if not j.gpus} == {None}
    assert "eapo_baseprior" in cfg["methods"]


# --- long jobs resume (issue 43) ----------------------------------------------------------------------------------
def test_a_trl_run_killed_after_a_checkpoint_resumes_and_ends_as_an_uninterrupted_one(
    prepared, tmp_path, fake_math_verify, monkeypatch
):
    """With the job's checkpoint folder in the spec, TRL saves there (every step here: every_s 0) with each process's
    sampler state beside it; a run killed after step 1's checkpoint, rerun, resumes there and writes the history and
    rollout statistics of an uninterrupted run."""
    from paperflow.core.lm import resume

    cfg, pretrained, data = prepared
    base = paper.model_folder(str(pretrained))
    spec = _spec(cfg, data, tmp_path, "eapo", base, prior=base, seed=100)
    spec["trl"]["max_steps"] = 2
    whole = {**spec, "history": str(tmp_path / "whole_history.csv"), "rollouts": str(tmp_path / "whole_rollouts.csv")}
    paper_train.run(whole)
    spec["checkpoints"] = str(tmp_path / "ckpt")

    class KilledAfterStep1(resume.TimedSave):
        def on_save(self, args, state, control, **kwargs):
            out = super().on_save(args, state, control, **kwargs)
            if state.global_step == 1:
                raise RuntimeError("killed")
            return out

    with monkeypatch.context() as m:
        m.setattr(resume, "TimedSave", KilledAfterStep1)
        with pytest.raises(RuntimeError, match="killed"):
            paper_train.run(spec, every_s=0)
    last = resume.last_checkpoint(spec["checkpoints"])
    assert last and last.endswith("checkpoint-1") and paper_train.rollout_file(last, 0).exists()
    assert not Path(spec["history"]).exists()
    paper_train.run(spec, every_s=0)
    timing = ["step_time"]
    for key in ("history", "rollouts"):
        got, want = pd.read_csv(spec[key]), pd.read_csv(whole[key])
        got, want = (
            got.drop(columns=[c for c in timing if c in got]),
            want.drop(columns=[c for c in timing if c in want]),
        )
        pd.testing.assert_frame_equal(got[sorted(got)], want[sorted(want)])


def test_evaluate_journals_its_rows_and_a_rerun_samples_only_what_is_missing(prepared, tmp_path, fake_math_verify):
    """evaluate's rows go to the journal per generate call; a rerun with part of the journal regenerates only the
    missing calls and ends with the frame an uninterrupted run gives (each call seeded by its place)."""
    cfg, pretrained, data = prepared
    args = (
        str(pretrained),
        {b: str(data[b]) for b in cfg["math"]["benchmarks"]},
        {b: cfg["math"]["datasets"][b]["k"] for b in cfg["math"]["benchmarks"]},
        cfg["math"]["evaluation"],
        "cpu",
        "float32",
        ["so"],
    )
    journal = tmp_path / "ckpt" / "rows.jsonl"
    whole = paper.evaluate(*args, journal=journal)
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[: len(lines) // 2]) + "\n")  # killed half way
    calls = []
    original = paper._generate
    paper._generate = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        resumed = paper.evaluate(*args, journal=journal)
    finally:
        paper._generate = original
    pd.testing.assert_frame_equal(whole, resumed)
    assert 0 < len(calls) < len(lines)
    assert paper.evaluate(*args).equals(whole)  # no journal: a scratch one, same rows
