"""itpo at paper scale, offline: the verl command lines generated from the config against the official scripts'
overrides (recipe/itpo/scripts/*.sh at the pinned commit, typed below), the interaction file, the simulator/judge
client against a local fake OpenAI-compatible server, the Hub downloads (only the listed files, at the pinned
commit; an unpinned one refused naming `paperflow pin itpo`), the recipe tree assembled from local git repositories
at exact commits, CollabLLM rows in their real columns made into verl's RL rows, the train -> evaluate -> report
path end to end with a fake `python` standing in for vLLM and verl (neither is installed here), config errors by
name, and the paper-scale DAG with GPUs on train and evaluate only."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from fake_hub import FakeHub, install
from fake_openai import FakeOpenAI, chat_choices

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.core.download import UnpinnedDownload
from paperflow.core.io import read_frame
from paperflow.core.lm import serve
from paperflow.itpo import collab, paper, recipe, serving

SHA = "0123456789abcdef0123456789abcdef01234567"
CFG = load_paper_config("itpo", "paper")

# recipe/itpo/scripts/math_rloo_itponorm.sh at Graph-COM/ITPO b1245e8 (its overrides, in its order)
MATH_ITPONORM = """
data.train_files="$train_files" data.val_files="$test_files" data.train_batch_size=16 data.max_prompt_length=1024
data.max_response_length=4096 data.filter_overlong_prompts=True data.filter_accuracy=False
data.accuracy_lower_bound=0.2 data.accuracy_upper_bound=0.8 data.oversample_factor=1
actor_rollout_ref.model.path=$model_path actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=4
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=True actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.val_kwargs.n=3
actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
algorithm.adv_estimator=rloo_itponorm algorithm.use_kl_in_reward=True algorithm.kl_penalty=kl
algorithm.kl_ctrl.kl_coef=0.001 algorithm.reward_gt_coef=0 algorithm.reward_dpo_coef=5 +algorithm.reward_turn_coef=0
reward_model.model.path=$model_path reward_model.micro_batch_size_per_gpu=1 reward_model.model.update=itponorm
reward_model.model.beta_train=0.010 reward_model.model.optim.lr=1e-6 reward_model.model.optim.grad_clip=10.0
reward_model.model.input_tokenizer=null reward_model.mini_batch_size=4 reward_model.ulysses_sequence_parallel_size=1
+reward_model.model.temp=0.4 critic.optim.lr=1e-5 critic.model.path=$model_path critic.ppo_micro_batch_size_per_gpu=1
critic.ppo_mini_batch_size=4 critic.enable=False trainer.val_before_train=False trainer.logger='["console","wandb"]'
trainer.project_name='verlxcollabllm' trainer.experiment_name=Qwen3-$TASK-rloo-itponorm trainer.n_gpus_per_node=2
trainer.nnodes=1 trainer.save_freq=50 trainer.test_freq=500 trainer.total_epochs=20
reward_model.reward_manager=collabllm +reward_model.reward_kwargs.metric_weights.accuracy=1
+reward_model.reward_kwargs.metric_weights.token_amount=-0.00005
+reward_model.reward_kwargs.llm_judge_kwargs.model="hosted_vllm/Qwen/Qwen2.5-14B-Instruct"
+reward_model.reward_kwargs.llm_judge_kwargs.max_tokens=2048 +reward_model.reward_kwargs.llm_judge_kwargs.temperature=0
+reward_model.reward_kwargs.llm_judge_kwargs.api_base="http://0.0.0.0:8001/v1" actor_rollout_ref.rollout.mode=async
actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.free_cache_engine=True
actor_rollout_ref.rollout.multi_turn.enable=true actor_rollout_ref.rollout.multi_turn.format=hermes
actor_rollout_ref.rollout.multi_turn.max_user_turns=4 actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5
actor_rollout_ref.rollout.trace.token2text=True custom_reward_function.path=recipe/itpo/reward_function.py
custom_reward_function.name=conversation_level_reward_func
actor_rollout_ref.rollout.multi_turn.interaction_config_path="$ROOT_FOLDER/verl/recipe/itpo/config/itpo_interaction_collab.yaml"
trainer.resume_mode=disable trainer.resume_from_path=$RESUME_PATH reward_model.enable_resource_pool=True
"""
# what the other scripts change relative to it (diffs of the scripts at the same commit)
SCRIPT_DELTAS = {
    ("math", "outcome"): {  # math_rloo_baseline.sh
        "algorithm.adv_estimator": "rloo",
        "algorithm.reward_gt_coef": "5",
        "algorithm.reward_dpo_coef": "0",
        "reward_model.model.update": "before",
        "reward_model.model.beta_train": "0.005",
        "+reward_model.model.temp": None,
    },
    ("math", "itpo"): {  # math_rloo_itpo.sh
        "algorithm.adv_estimator": "rloo_itpo",
        "reward_model.model.update": "itpo",
        "reward_model.model.beta_train": "0.050",
    },
    ("doc", "itponorm"): {  # medium_rloo_itponorm.sh
        "data.max_response_length": "3072",
        "actor_rollout_ref.actor.optim.lr": "5e-7",
        "algorithm.reward_dpo_coef": "15",
        "reward_model.model.beta_train": "0.005",
        "+reward_model.reward_kwargs.metric_weights.accuracy": None,
        "+reward_model.reward_kwargs.metric_weights.bleu_score": "1",
    },
    ("doc", "itpo"): {  # medium_rloo_itpo.sh
        "data.max_response_length": "3072",
        "actor_rollout_ref.actor.optim.lr": "5e-7",
        "algorithm.adv_estimator": "rloo_itpo",
        "algorithm.reward_dpo_coef": "15",
        "reward_model.model.update": "itpo",
        "reward_model.model.beta_train": "0.005",
        "+reward_model.reward_kwargs.metric_weights.accuracy": None,
        "+reward_model.reward_kwargs.metric_weights.bleu_score": "1",
    },
}
# overrides whose values are paths, names or addresses of this pipeline, not hyperparameters
LOCAL = {
    "data.train_files",
    "data.val_files",
    "actor_rollout_ref.model.path",
    "reward_model.model.path",
    "critic.model.path",
    "trainer.logger",
    "trainer.project_name",
    "trainer.experiment_name",
    "+reward_model.reward_kwargs.llm_judge_kwargs.api_base",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "trainer.resume_from_path",
    "trainer.default_local_dir",
}


def _parse(words) -> dict[str, str]:
    return dict(w.split("=", 1) for w in words)


def _value(v: str):
    """A script value as Hydra reads it: numbers compared as numbers, quotes dropped."""
    v = v.strip("'\"")
    try:
        return float(v)
    except ValueError:
        return v


def _paths(tmp_path: Path) -> dict[str, str]:
    return {
        "train": str(tmp_path / "rl_train.parquet"),
        "validation": str(tmp_path / "rl_validation.parquet"),
        "model": str(tmp_path / "model"),
        "checkpoints": str(tmp_path / "ckpt"),
        "base_url": "http://127.0.0.1:8001/v1",
        "name": "run",
        "interaction": str(tmp_path / "interaction.yaml"),
        "resume": str(tmp_path / "ckpt" / "global_step_7"),
    }


@pytest.mark.parametrize(("task", "method"), [("math", "itponorm"), *SCRIPT_DELTAS])
def test_the_generated_training_overrides_are_the_official_scripts(task, method, tmp_path):
    expected = _parse(MATH_ITPONORM.split())
    for key, value in SCRIPT_DELTAS.get((task, method), {}).items():
        if value is None:
            expected.pop(key)
        else:
            expected[key] = value
    got = _parse(
        recipe.train_overrides(task, CFG["tasks"][task], method, CFG["verl"], CFG["simulator"], _paths(tmp_path))
    )
    assert len(got) == len(
        recipe.train_overrides(task, CFG["tasks"][task], method, CFG["verl"], CFG["simulator"], _paths(tmp_path))
    )
    hyper = {k: _value(v) for k, v in expected.items() if k not in LOCAL}
    assert {k: _value(v) for k, v in got.items() if k not in LOCAL} == hyper
    assert set(got) - set(expected) == {"trainer.default_local_dir"}
    assert set(expected) - set(got) == {"trainer.resume_from_path"}
    assert got["actor_rollout_ref.model.path"] == got["reward_model.model.path"] == str(tmp_path / "model")
    assert got["+reward_model.reward_kwargs.llm_judge_kwargs.api_base"] == "http://127.0.0.1:8001/v1"
    assert got["data.train_files"] == f"['{tmp_path / 'rl_train.parquet'}']"


def test_the_evaluation_resumes_the_run_greedily_as_eval_sh(tmp_path):
    paths = _paths(tmp_path)
    got = _parse(recipe.eval_overrides("doc", CFG["tasks"]["doc"], "itpo", CFG["verl"], CFG["simulator"], paths))
    assert got["trainer.resume_mode"] == "resume_path" and got["trainer.resume_from_path"] == paths["resume"]
    assert got["trainer.val_before_train"] == "True"
    assert got["data.train_files"] == got["data.val_files"] == f"['{paths['validation']}']"
    assert (got["actor_rollout_ref.rollout.val_kwargs.n"], got["actor_rollout_ref.rollout.val_kwargs.do_sample"]) == (
        "32",
        "False",
    )
    assert got["actor_rollout_ref.rollout.temperature"] == "0.0"
    assert got["+reward_model.reward_kwargs.metric_weights.bleu_score"] == "1"
    cmd = recipe.command(recipe.EVAL_MODULE, [f"{k}={v}" for k, v in got.items()], python="py")
    assert cmd[:3] == ["py", "-m", "recipe.itpo.evaluate"]


def test_the_interaction_file_is_the_recipes_with_the_local_address():
    doc = recipe.interaction_config(CFG["simulator"], "http://127.0.0.1:8001/v1", 1.0)
    (entry,) = doc["interaction"]
    assert entry["name"] == "collabllm" and entry["class_name"] == recipe.INTERACTION_CLASS
    assert entry["config"] == {
        "user_model": "hosted_vllm/Qwen/Qwen2.5-14B-Instruct",
        "num_retries": 3,
        "max_tokens": 512,
        "temperature": 1.0,
        "enable_log": True,
        "api_base": "http://127.0.0.1:8001/v1",
    }


def test_a_method_the_recipe_lacks_is_refused_by_name():
    with pytest.raises(ConfigError, match="'itponorm_grpo' is not wired at paper scale"):
        recipe.train_overrides("math", CFG["tasks"]["math"], "itponorm_grpo", CFG["verl"], CFG["simulator"], {})


# --- the simulator / judge client against a fake OpenAI-compatible server ---


SIMULATOR = "Qwen/Qwen2.5-14B-Instruct"


@pytest.fixture
def fake_server():
    answer = lambda path, body: chat_choices([f"echo: {body['messages'][-1]['content']}"])  # noqa: E731
    with FakeOpenAI(answer, name=SIMULATOR) as server:
        assert server.url == serving.base_url(server.server.server_address[1])
        yield server


def test_the_client_waits_for_the_model_and_chats(fake_server):
    url = fake_server.url
    assert serve.wait_ready(url, served_name=SIMULATOR, timeout_s=5, poll_s=0.05) >= 0
    assert serving.probe(url, SIMULATOR) == "echo: Reply with the single word: ready"
    assert fake_server.bodies[-1] == {
        "model": SIMULATOR,
        "messages": [{"role": "user", "content": "Reply with the single word: ready"}],
        "temperature": 0.0,
        "max_tokens": 8,
    }
    with pytest.raises(RuntimeError, match="HTTP 404"):
        serving.chat(url, "other/model", [{"role": "user", "content": "hi"}])
    assert len(fake_server.bodies) == 2  # a refused request is not retried


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_vllm_server_command_is_the_readmes_on_loopback():
    cmd = serving.server_command(CFG["simulator"], "/models/q14", python="py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags == {
        "--model": "/models/q14",
        "--served-model-name": "Qwen/Qwen2.5-14B-Instruct",
        "--host": "127.0.0.1",
        "--port": "8001",
        "--tensor-parallel-size": "2",
    }


# --- downloads: a fake Hub, git repositories on disk ---

SYSTEM = "You are a proactive assistant.\nAsk when the request is unclear."


def hub_rows(n: int = 12) -> pd.DataFrame:
    """CollabLLM multiturn rows in the Hub's columns (prompt, completion, conv_id, score, single_turn_prompt,
    single_turn_completion, single_turn_metadata, turn_id, sessions, rewards); rows 0 and 1 share a prompt."""
    rows = []
    for i in range(n):
        first = i if i > 1 else 0
        rows.append(
            {
                "prompt": [
                    {"role": "user", "content": f"help me with problem {first}"},
                    {"role": "assistant", "content": "which part?"},
                    {"role": "user", "content": "all of it"},
                ],
                "completion": f"answer {i}",
                "conv_id": i // 2,
                "score": 0.5,
                "single_turn_prompt": f"Solve problem {first} exactly.",
                "single_turn_completion": f"\\boxed{{{first}}}",
                "single_turn_metadata": json.dumps({"level": 5}),
                "turn_id": i % 2,
                "sessions": json.dumps([]),
                "rewards": json.dumps({"accuracy": [1.0]}),
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """download_pretrained replaced by a fake Hub that writes the files matching the patterns (a dataset repo's
    data/train-00000-of-00001.parquet, a model repo's config and weights); returns the calls."""
    hub = FakeHub(
        dataset={"data/train-00000-of-00001.parquet": hub_rows(), "README.md": b"card"},
        model={"config.json": b"{}", "model.safetensors": b"w", "tokenizer.json": b"{}", "README.md": b"card"},
    )
    return install(monkeypatch, hub).calls


def test_downloads_fetch_only_the_listed_files_at_the_pinned_commit(hub, tmp_path):
    doc = paper.download_hub(CFG["pretrained"], "pretrained", str(tmp_path / "cache"), str(tmp_path / "p.json"))
    task = {**CFG["tasks"]["math"], "revision": SHA}
    data = paper.download_hub(task, "tasks.math", str(tmp_path / "cache"), str(tmp_path / "math.json"))
    assert hub == [
        {
            "name": "Qwen/Qwen2.5-3B-Instruct",
            "revision": CFG["pretrained"]["revision"],
            "patterns": CFG["pretrained"]["files"],
            "repo_type": "model",
            "written": ["config.json", "model.safetensors", "tokenizer.json"],
        },  # not the README beside them
        {
            "name": "collabllm/collabllm-multiturn-math-hard",
            "revision": SHA,
            "patterns": ["data/*.parquet"],
            "repo_type": "dataset",
            "written": ["data/train-00000-of-00001.parquet"],
        },
    ]
    assert sorted(doc["sha256"]) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert list(data["sha256"]) == ["data/train-00000-of-00001.parquet"]
    assert data["folder"].endswith(f"datasets/collabllm--collabllm-multiturn-math-hard/{SHA}")
    assert json.loads((tmp_path / "math.json").read_text()) == data


def test_an_unpinned_dataset_is_refused_naming_paperflow_pin(hub, tmp_path, monkeypatch):
    from paperflow.core import download

    monkeypatch.setattr(download, "read_lock_revisions", lambda slug, root=None: {})  # whatever the checkout holds
    with pytest.raises(UnpinnedDownload, match=r"tasks\.doc\.revision .*`paperflow pin itpo`"):
        paper.download_hub(CFG["tasks"]["doc"], "tasks.doc", str(tmp_path), str(tmp_path / "d.json"))
    with pytest.raises(ConfigError, match="not a pinned revision"):
        paper.download_hub({**CFG["simulator"], "revision": "main"}, "simulator", str(tmp_path), str(tmp_path / "s"))
    assert hub == []


def _git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    import os

    out = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env={**os.environ, **env})
    return out.stdout.strip()


def _repo(root: Path, files: dict[str, str]) -> str:
    root.mkdir(parents=True)
    _git(root, "init", "-q")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "c")
    return _git(root, "rev-parse", "HEAD")


@pytest.fixture
def recipe_json(tmp_path):
    """ITPO and verl as local git repositories, fetched at their commits and assembled by download_recipe."""
    itpo_sha = _repo(
        tmp_path / "src" / "itpo",
        {
            "recipe/itpo/main_prime.py": "# trainer\n",
            "recipe/itpo/process_data/process_dataset.py": f"X = 1\nSYSTEM_PROMPT = {SYSTEM!r}\n",
            "verl/interactions/collabllm_interaction.py": "# ITPO's simulator\n",
            "README.md": "itpo\n",
        },
    )
    verl_sha = _repo(
        tmp_path / "src" / "verl",
        {
            "verl/__init__.py": "",
            "verl/interactions/collabllm_interaction.py": "# verl's\n",
            "recipe/prime/x.py": "",
        },
    )
    source = {
        "itpo": {"git": (tmp_path / "src" / "itpo").as_uri(), "commit": itpo_sha},
        "verl": {"git": (tmp_path / "src" / "verl").as_uri(), "commit": verl_sha},
    }
    out = tmp_path / "recipe.json"
    doc = paper.download_recipe(source, str(tmp_path / "cache"), str(out))
    return out, doc, source


def test_the_recipe_tree_is_verl_with_itpos_files_at_exact_commits(recipe_json, tmp_path):
    _, doc, source = recipe_json
    tree = Path(doc["tree"])
    assert (tree / "verl" / "interactions" / "collabllm_interaction.py").read_text() == "# ITPO's simulator\n"
    assert (tree / "recipe" / "itpo" / "main_prime.py").is_file() and (tree / "recipe" / "prime" / "x.py").is_file()
    assert not (tree / "README.md").exists() and not (tree / ".git").exists()
    assert doc["overlaid"] == [
        "recipe/itpo/main_prime.py",
        "recipe/itpo/process_data/process_dataset.py",
        "verl/interactions/collabllm_interaction.py",
    ]
    from paperflow.core import download

    with pytest.raises(RuntimeError, match="git fetch"):
        download.git_checkout(source["verl"]["git"], "f" * 40, tmp_path / "x", "recipe.verl.commit")
    with pytest.raises(ConfigError, match="recipe.verl.commit"):
        download.git_checkout(source["verl"]["git"], "main", tmp_path / "x", "recipe.verl.commit")


def test_collabllm_rows_become_the_recipes_rl_rows(hub, recipe_json, tmp_path):
    task = {**CFG["tasks"]["math"], "revision": SHA}
    paper.download_hub(task, "tasks.math", str(tmp_path / "cache"), str(tmp_path / "math.json"))
    outs = [{s: str(tmp_path / f"{k}{s}.parquet") for s in ("train", "validation")} for k in ("a", "b")]
    for out in outs:
        counts = paper.preprocess("math", task, str(tmp_path / "math.json"), str(recipe_json[0]), CFG["split"], out)
    assert counts == {"train": 9, "validation": 2}  # 12 rows, one duplicate prompt; datasets' 10% rounds up
    train = pd.read_parquet(outs[0]["train"])
    for s in ("train", "validation"):  # reproducible, byte for byte
        assert Path(outs[0][s]).read_bytes() == Path(outs[1][s]).read_bytes()
    row = train.iloc[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and row["prompt"][0]["content"] == SYSTEM
    kwargs = row["extra_info"]["interaction_kwargs"]
    assert kwargs["name"] == "collabllm" and kwargs["task_desc"] == "solving math problems"
    assert kwargs["single_turn_prompt"].startswith("Solve problem")
    assert row["ground_truth"] == row["reward_model"]["ground_truth"] == row["extra_info"]["single_turn_completion"]
    assert row["agent_name"] == "itpo_collabllm_agent" and row["data_source"] == "collabllm"
    both = pd.concat([train, pd.read_parquet(outs[0]["validation"])])
    assert both["index"].is_unique and len(both) == 11


# --- train -> evaluate -> report with a fake `python` for vLLM and verl ---

FAKE_PYTHON = r'''#!{exe}
"""Stands in for `python` in the recipe env: vLLM's OpenAI server, verl's trainer and its evaluator."""
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

args = sys.argv[1:]
module = args[1]
log = Path(os.environ["FAKE_LOG"])
with log.open("a") as f:
    f.write(json.dumps({{"module": module, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "pythonpath": os.environ.get("PYTHONPATH", ""), "cwd": os.getcwd()}}) + "\n")
if module == "vllm.entrypoints.openai.api_server":
    flags = dict(zip(args[2::2], args[3::2]))
    name = flags["--served-model-name"]

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, doc):
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send({{"data": [{{"id": name}}]}})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._send({{"choices": [{{"message": {{"role": "assistant", "content": "ready"}}}}]}})

    HTTPServer((flags["--host"], int(flags["--port"])), H).serve_forever()
over = dict(a.split("=", 1) for a in args[2:])
if module == "recipe.itpo.main_prime":
    ckpt = Path(over["trainer.default_local_dir"])
    (ckpt / "global_step_6" / "actor").mkdir(parents=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("6")
    # a Ray worker of the run: the runtime env's variables, the setup hook it names, then two training steps
    # reaching the trainer module's compute_advantage with the batch the recipe builds (8 episodes, 2 groups)
    import importlib, types
    import torch
    prefix = "+ray_kwargs.ray_init.runtime_env.env_vars."
    os.environ.update({{k[len(prefix):]: v for k, v in over.items() if k.startswith(prefix)}})
    trainer = types.ModuleType("recipe.itpo.prime_ray_trainer")
    trainer.compute_advantage = lambda data, adv_estimator, config: None
    sys.modules[trainer.__name__] = trainer
    hook = over["+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"].rsplit(".", 1)
    getattr(importlib.import_module(hook[0]), hook[1])()
    for step in range(2):
        mask = torch.tensor([[0, 1, 1, 0, 1, 0]] * 8)
        outcome = torch.tensor([1.0, 0.0] * 4)
        batch = {{"response_mask": mask, "scores": outcome}}
        if over["algorithm.reward_dpo_coef"] != "0":  # the PRM's scores: higher on the turns of good episodes
            scores = (outcome[:, None] - 0.5 + 0.01 * step) * mask
            batch.update(before_update_rm_scores=scores, rm_scores=2 * scores)
        data = types.SimpleNamespace(batch=batch, non_tensor_batch={{"uid": [f"p{{i // 4}}" for i in range(8)]}})
        trainer.compute_advantage(data, over["algorithm.adv_estimator"], None)
elif module == "recipe.itpo.evaluate":
    # RayPRIMEEvaluator: the rows of data.val_files in its val DataLoader's shuffled order (shuffle=True), each
    # repeated val_kwargs.n times in a row, the decoded prompt (Qwen's template, special tokens dropped) as input
    import random
    import pyarrow.parquet as pq
    assert over["trainer.resume_from_path"].endswith("global_step_6"), over["trainer.resume_from_path"]
    (val,) = json.loads(over["data.val_files"].replace("'", '"'))
    with log.with_name("shards.log").open("a") as f:
        f.write(Path(val).name + "\n")
    if Path(val).name == os.environ.get("FAKE_DIE_ON"):
        sys.exit(9)
    rows = pq.read_table(val).to_pylist()
    random.Random(os.environ.get("FAKE_SHUFFLE_SEED", "0") + val).shuffle(rows)
    out = Path("recipe/itpo/val_out")
    out.mkdir(parents=True, exist_ok=True)
    good = "itponorm" in over["trainer.experiment_name"]
    dump = []
    for row in rows:
        text = "".join(f"{{m['role']}}\n{{m['content']}}\n" for m in row["prompt"]) + "assistant\n"
        for r in range(int(over["actor_rollout_ref.rollout.val_kwargs.n"])):
            dump.append({{"input": text, "output": f"assistant: {{row['prompt'][-1]['content']}}? #{{r}} user: thanks",
                         "gts": row["reward_model"]["ground_truth"], "score": (0.9 if good else 0.4) - 0.0003,
                         "step": 6}})
    (out / "6.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dump))
'''


def _fake_verl_inputs(recipe_json, tmp_path, monkeypatch, port: int) -> tuple[dict, dict[str, str]]:
    """The config and the downloaded, preprocessed inputs (pretrained, simulator, recipe, train, validation) of a
    run against the fake verl, with its call log and the job's GPUs in the environment."""
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg = {
        "tasks": {"math": {**CFG["tasks"]["math"], "revision": SHA}},
        "simulator": {**CFG["simulator"], "port": port, "ready_timeout_s": 30},
        "verl": {**CFG["verl"], "device": "cpu", "train_batch_size": 2},  # the fake data's 2 validation rows
        "evaluate": CFG["evaluate"],
    }
    cache = str(tmp_path / "cache")
    inputs = {
        "pretrained": str(tmp_path / "pretrained.json"),
        "simulator": str(tmp_path / "simulator.json"),
        "recipe": str(recipe_json[0]),
        "train": str(tmp_path / "rl_train.parquet"),
        "validation": str(tmp_path / "rl_validation.parquet"),
    }
    paper.download_hub(CFG["pretrained"], "pretrained", cache, inputs["pretrained"])
    paper.download_hub(CFG["simulator"], "simulator", cache, inputs["simulator"])
    paper.download_hub(cfg["tasks"]["math"], "tasks.math", cache, str(tmp_path / "math.json"))
    paper.preprocess(
        "math",
        cfg["tasks"]["math"],
        str(tmp_path / "math.json"),
        inputs["recipe"],
        CFG["split"],
        {"train": inputs["train"], "validation": inputs["validation"]},
    )
    return cfg, inputs


def test_train_evaluate_and_report_run_end_to_end_with_a_fake_verl(hub, recipe_json, tmp_path, monkeypatch):
    exe = tmp_path / "fake_python"
    exe.write_text(FAKE_PYTHON.format(exe=sys.executable))
    exe.chmod(0o755)
    port = _free_port()
    cfg, inputs = _fake_verl_inputs(recipe_json, tmp_path, monkeypatch, port)
    summaries = []
    for method in ("outcome", "itponorm"):
        run_json = tmp_path / "runs" / method / "run.json"
        run = paper.train(
            "math", method, [0], cfg, inputs, str(run_json), python=str(exe), turns=str(run_json.parent / "turns.jsonl")
        )
        assert run["global_step"] == 6 and run["checkpoint"].endswith("checkpoints/global_step_6")
        assert (run["simulator_gpus"], run["verl_gpus"]) == ("4,5", "6,7")
        outputs = {
            "rollouts": str(tmp_path / "eval" / f"{method}.parquet"),
            "summary": str(tmp_path / "eval" / f"{method}.json"),
        }
        summaries.append(paper.evaluate("math", method, cfg, {**inputs, "run": str(run_json)}, outputs, str(exe)))
        frame, meta = read_frame(outputs["rollouts"])
        assert len(frame) == 2 * CFG["verl"]["eval"]["n"] and meta["prompts"] == 2 and meta["metric_mean"] is None
        assert meta["shards"] == 1 and meta["unscored_prompts"] == 0
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["module"] for c in calls] == [
        "vllm.entrypoints.openai.api_server",
        "recipe.itpo.main_prime",
        "vllm.entrypoints.openai.api_server",
        "recipe.itpo.evaluate",
    ] * 2
    tree = json.loads(Path(inputs["recipe"]).read_text())["tree"]
    for c in calls:
        assert c["gpus"] == ("4,5" if c["module"].startswith("vllm") else "6,7")
        if c["module"].startswith("recipe"):
            assert c["pythonpath"].split(":")[0] == tree and Path(c["cwd"], "recipe", "itpo", "main_prime.py").is_file()
    command = json.loads((tmp_path / "runs" / "itponorm" / "command.json").read_text())["command"]
    assert "algorithm.adv_estimator=rloo_itponorm" in command and command[1:3] == ["-m", "recipe.itpo.main_prime"]
    interaction = yaml.safe_load((tmp_path / "runs" / "itponorm" / "interaction.yaml").read_text())
    assert interaction["interaction"][0]["config"]["api_base"] == f"http://127.0.0.1:{port}/v1"

    # the hook wrote the itponorm run's turns (2 steps x 8 episodes x 2 turns), nothing for outcome-only RLOO
    logged = [json.loads(line) for line in (tmp_path / "runs" / "itponorm" / "turns.jsonl").read_text().splitlines()]
    assert len(logged) == 16 and logged[0]["tokens"] == [2, 1] and logged[0]["score"] == pytest.approx([0.5, 0.5])
    assert (tmp_path / "runs" / "outcome" / "turns.jsonl").read_text() == ""
    command = json.loads((tmp_path / "runs" / "itponorm" / "command.json").read_text())["command"]
    assert "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=paperflow.itpo.turn_log.setup" in command

    from paperflow.core.report import publish
    from paperflow.itpo.paper_report import build_report, turn_table

    turns = turn_table({("math", m, "s0"): str(tmp_path / "runs" / m / "turns.jsonl") for m in ("outcome", "itponorm")})
    runs = pd.DataFrame(summaries)
    params = {
        "methods": ["outcome", "itponorm"],
        "tasks": ["math"],
        "seeds": [0],
        "metrics": {"math": "accuracy"},
        "scale": "paper",
    }
    specs = [c for c in load_paper_config("itpo", "paper")["claims"] if c["metric"] == "math/reward"]
    outputs = {
        "report": str(tmp_path / "r.md"),
        "metrics": str(tmp_path / "m.json"),
        "table_runs": str(tmp_path / "runs.csv"),
        "metrics_table": str(tmp_path / "m.parquet"),
    }
    doc = publish(build_report(runs, params), outputs, paper="itpo", scale="paper", claims=specs)
    (claim,) = doc["claims"]
    assert claim["id"] == "paper_math_reward_itponorm_minus_outcome" and not claim["gated"]
    assert claim["effects"][0] > 0 and claim["verdict"] == "inconclusive"  # one seed: no interval
    swapped = runs.assign(method=runs["method"].map({"outcome": "itponorm", "itponorm": "outcome"}))
    doc = publish(build_report(swapped, params), outputs, paper="itpo", scale="paper", claims=specs)
    assert doc["claims"][0]["effects"][0] < 0  # the baseline in its place
    assert "not in the dump" in Path(tmp_path / "r.md").read_text()
    # the turn-credit claim on the hook's log: ITPO-norm's turn scores separate the good episodes' turns (AUROC 1);
    # the control, the turn lengths (equal in both), does not; one seed gives no interval
    specs = [c for c in load_paper_config("itpo", "paper")["claims"] if c["metric"] == "math/turn_auroc"]
    doc = publish(build_report(runs, params, turns), outputs, paper="itpo", scale="paper", claims=specs)
    (claim,) = doc["claims"]
    assert claim["id"] == "paper_math_turn_auroc_itponorm" and claim["gated"]
    assert claim["effects"] == [pytest.approx(0.5)] and claim["verdict"] == "inconclusive"
    assert claim["control"]["method"] == "itponorm_turn_length" and claim["control"]["value"] == pytest.approx(0.0)
    assert "Turn credit from the recipe's per-turn log" in Path(tmp_path / "r.md").read_text()


def test_the_evaluation_summary_reads_the_latest_dump_and_the_metric_where_it_is_per_rollout(tmp_path):
    rows = [
        {"input": "q0", "output": "a b c", "gts": "1", "score": 0.5, "accuracy": 1.0},
        {"input": "q0", "output": "a b", "gts": "1", "score": 0.0, "accuracy": 0.0},
        {"input": "q1", "output": "a", "gts": "2", "score": 1.0, "accuracy": 1.0},
    ]
    (tmp_path / "9.jsonl").write_text(json.dumps({"input": "old", "output": "", "score": 9.0}) + "\n")
    (tmp_path / "10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    frame = collab.generations_frame(collab.read_dump(tmp_path))
    assert frame["output_words"].tolist() == [3, 2, 1]
    assert collab.summarise(frame, "accuracy") == {
        "rollouts": 3,
        "prompts": 2,
        "reward": 0.5,
        "metric": "accuracy",
        "metric_mean": 2 / 3,
        "output_words": 2.0,
    }
    assert collab.summarise(frame, "bleu_score")["metric_mean"] is None
    with pytest.raises(FileNotFoundError, match="dumped no generations"):
        collab.read_dump(tmp_path / "none")
    (tmp_path / "11.jsonl").write_text(json.dumps({"input": "q", "output": "a"}) + "\n")
    with pytest.raises(ValueError, match="no \\['score'\\] field"):
        collab.read_dump(tmp_path)
    with pytest.raises(ValueError, match="SYSTEM_PROMPT"):
        (tmp_path / "t" / "recipe" / "itpo" / "process_data").mkdir(parents=True)
        (tmp_path / "t" / collab.SYSTEM_PROMPT_FILE).write_text("PROMPT = 'x'\n")
        collab.system_prompt(tmp_path / "t")


def test_a_cuda_job_without_its_gpus_fails_naming_the_key():
    with pytest.raises(ConfigError, match="verl.device = 'cuda' needs .* 4 GPUs"):
        paper.gpu_split(CFG["simulator"], CFG["verl"])


# --- config and DAG ---


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("methods: [outcome, prime, itpo, itponorm]   #", "methods: [outcome, grpo]   #"), "grpo"),
        (("    gpus: 4\n", "    gpus: 2\n"), "resources.gpus = 2"),
        (("beta: {outcome: 0.005, prime: 0.05, itpo: 0.05, itponorm: 0.01}", "beta: {outcome: 0.005}"), "beta"),
        (("commit: b1245e8855e6f72f87feee4c6d00cfed01ede755", "commit: main"), "commit"),
        (("    shard_prompts: 64\n", "    shard_prompts: 0\n"), "shard_prompts"),
        (("    shard_prompts: 64\n", ""), "paper.evaluate"),
    ],
)
def test_paper_config_errors_name_the_key(tmp_path, edit, message):
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "config" / "schemas").mkdir(parents=True)
    schema = "config/schemas/itpo.schema.yaml"
    (tmp_path / schema).write_text((root / schema).read_text())
    text = (root / "config" / "itpo.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "config" / "itpo.yaml").write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ConfigError, match=message):
        load_paper_config("itpo", "paper", tmp_path)


def test_paper_scale_dry_run_has_gpus_on_train_and_evaluate_only(dry_repo):
    from conftest import run_snakemake

    from paperflow.core.plan import parse_dry_run

    proc = run_snakemake(dry_repo, "-n", "--forceall", "--config", "scale=paper", "papers=[itpo]")
    runs = len(CFG["tasks"]) * len(CFG["methods"]) * len(CFG["seeds"])
    counts = dict(re.findall(r"^(itpo_\w+)\s+(\d+)$", proc.stdout, re.M))
    assert counts == {
        "itpo_download_model": "1",
        "itpo_download_simulator": "1",
        "itpo_download_recipe": "1",
        "itpo_download": str(len(CFG["tasks"])),
        "itpo_preprocess": str(len(CFG["tasks"])),
        "itpo_train": str(runs),
        "itpo_evaluate": str(runs),
        "itpo_report": "1",
    }
    gpus = {}
    for job in parse_dry_run(proc.stdout):
        gpus.setdefault(job.rule, set()).add(job.gpus)
    assert gpus["itpo_train"] == gpus["itpo_evaluate"] == {4}
    assert all(v == {0} for r, v in gpus.items() if r not in ("itpo_train", "itpo_evaluate"))
    # every training run writes the hook's per-turn log, and the report reads them all
    blocks = {m.group(1): m.group(0) for m in re.finditer(r"rule (itpo_\w+):\n(?:    .*\n)+", proc.stdout)}
    logs = re.findall(r"runs/(\w+)/(\w+)/(s\d+)/turns\.jsonl", proc.stdout)
    report = next(m.group(0) for m in re.finditer(r"rule itpo_report:\n(?:    .*\n)+", proc.stdout))
    runs = {(t, m, f"s{s}") for t in CFG["tasks"] for m in CFG["methods"] for s in CFG["seeds"]}
    assert set(logs) == runs and "itpo_train" in blocks
    assert set(re.findall(r"runs/(\w+)/(\w+)/(s\d+)/turns\.jsonl", report.split("output:")[0])) == runs


# --- the per-turn log: a hook in the recipe's trainer, and the report's turn AUROC ---


def _recipe_batch(mask, before, after, outcome, uid):
    """A stand-in for the recipe's DataProto at `compute_advantage`: the tensors it reads and the prompt groups."""
    from types import SimpleNamespace

    batch = {"response_mask": mask, "before_update_rm_scores": before, "rm_scores": after, "scores": outcome}
    return SimpleNamespace(batch=batch, non_tensor_batch={"uid": np.array(uid, dtype=object)})


def _fake_trainer_module():
    """The recipe trainer's module as far as the hook touches it: a `compute_advantage` that records its calls."""
    from types import SimpleNamespace

    calls = []

    def compute_advantage(data, adv_estimator, config):
        calls.append((data, adv_estimator))
        return "advantages"

    return SimpleNamespace(compute_advantage=compute_advantage, calls=calls)


def test_the_turn_log_on_the_golden_fixture_is_the_recipes_segment_means_and_our_turn_scores(tmp_path):
    """The hook's per-turn scores on the golden fixture (2 prompts x n = 4, 2-3 turns) equal the plain-Python trace
    of the recipe's segment means (`calculate_segment_proportions_itponorm`: sums / counts over the runs of 1s of
    response_mask) and the synthetic scales' turn scores (rewards.turn_stats, as analysis.turn_scores takes them);
    the recipe's own compute_advantage still runs on the same batch, once per step."""
    import torch
    from test_itpo import GOLDEN_MASK, GOLDEN_OUTCOME, GOLDEN_SCORES, _ref_turn_scores, _segments

    from paperflow.itpo import rewards, turn_log

    mask = torch.tensor(GOLDEN_MASK)
    before = torch.tensor(GOLDEN_SCORES) * mask
    after = before * 2 + 0.1 * mask
    data = _recipe_batch(mask, before, after, torch.tensor(GOLDEN_OUTCOME), ["p0"] * 4 + ["p1"] * 4)
    module, path = _fake_trainer_module(), tmp_path / "turns.jsonl"
    turn_log.install(path, module)
    turn_log.install(path, module)  # idempotent: one log line per episode and step
    assert module.compute_advantage(data, "rloo_itponorm", None) == "advantages"
    module.compute_advantage(data, "rloo_itponorm", None)
    assert [c[1] for c in module.calls] == ["rloo_itponorm"] * 2 and module.calls[0][0] is data
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [1] * 8 + [2] * 8
    ref_before = _ref_turn_scores(GOLDEN_MASK, before.tolist())
    ref_after = _ref_turn_scores(GOLDEN_MASK, after.tolist())
    t = rewards.turn_stats(before, mask)
    ours = (t.sums / t.counts.clamp(min=1)).tolist()
    for r in records[:8]:
        i = r["episode"]
        assert r["score"] == pytest.approx(ref_before[i], abs=1e-6)
        assert r["score"] == pytest.approx(ours[i][: len(ref_before[i])], abs=1e-6)
        assert r["score_after"] == pytest.approx(ref_after[i], abs=1e-6)
        assert r["tokens"] == [len(s) for s in _segments(GOLDEN_MASK[i])]
        assert (r["outcome"], r["uid"]) == (GOLDEN_OUTCOME[i], "p0" if i < 4 else "p1")
    # the logged S_k / n_k are what ITPO-norm's weights are made of: softmax over a row of (S_k / n_k) n_bar / T
    n_bar = np.mean([n for r in records[:8] for n in r["tokens"]])
    w = rewards.proportions_itponorm(after, mask, 0.4)
    for r in records[:8]:
        logits = np.array(r["score_after"]) * n_bar / 0.4
        expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        assert w[r["episode"], : len(expected)].numpy() == pytest.approx(expected, abs=1e-5)


def test_the_turn_log_skips_outcome_only_batches_and_refuses_a_batch_without_the_recipes_keys(tmp_path):
    import torch

    from paperflow.itpo import turn_log

    mask = torch.tensor([[0, 1, 1, 0, 1]] * 2)
    data = _recipe_batch(mask, mask * 0.1, mask * 0.2, torch.tensor([1.0, 0.0]), ["a", "a"])
    no_prm = _recipe_batch(mask, None, None, torch.tensor([1.0, 0.0]), ["a", "a"])
    for key in ("before_update_rm_scores", "rm_scores"):
        no_prm.batch.pop(key)
    assert turn_log.episode_rows(1, no_prm) == []  # reward_dpo_coef 0: the recipe runs no PRM
    data.batch.pop("scores")
    with pytest.raises(KeyError, match="scores"):
        turn_log.episode_rows(1, data)


def test_the_hook_installs_where_the_runtime_env_names_a_log(tmp_path, monkeypatch):
    from paperflow.itpo import recipe, turn_log

    module = _fake_trainer_module()
    original = module.compute_advantage
    monkeypatch.setitem(sys.modules, turn_log.TRAINER_MODULE, module)
    monkeypatch.delenv(recipe.TURN_LOG_ENV, raising=False)
    turn_log.setup()
    assert module.compute_advantage is original  # no log named: the worker is left alone
    monkeypatch.setenv(recipe.TURN_LOG_ENV, str(tmp_path / "t.jsonl"))
    turn_log.setup()
    assert module.compute_advantage is not original
    assert module.compute_advantage.turn_log_path == str(tmp_path / "t.jsonl")


def test_the_training_launch_carries_the_hook_and_the_evaluation_does_not(tmp_path):
    paths = {**_paths(tmp_path), "turn_log": str(tmp_path / "turns.jsonl")}
    got = _parse(recipe.train_overrides("math", CFG["tasks"]["math"], "itponorm", CFG["verl"], CFG["simulator"], paths))
    assert got["+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"] == "paperflow.itpo.turn_log.setup"
    assert got["+ray_kwargs.ray_init.runtime_env.env_vars.PAPERFLOW_ITPO_TURN_LOG"] == paths["turn_log"]
    plain = _parse(
        recipe.train_overrides(
            "math", CFG["tasks"]["math"], "itponorm", CFG["verl"], CFG["simulator"], _paths(tmp_path)
        )
    )
    assert set(got) - set(plain) == {k for k in got if k.startswith("+ray_kwargs.")}
    assert not any(
        "ray_kwargs" in o
        for o in recipe.eval_overrides("math", CFG["tasks"]["math"], "itponorm", CFG["verl"], CFG["simulator"], paths)
    )
    # the hook is importable by the name the launch gives Ray
    module, name = recipe.TURN_LOG_HOOK.rsplit(".", 1)
    import importlib

    assert callable(getattr(importlib.import_module(module), name))


def test_turn_labels_are_the_episodes_outcome_against_its_groups_leave_one_out_mean():
    from paperflow.itpo import paper_report

    turns = pd.DataFrame(
        {
            "step": [1, 1, 1, 1, 1, 1, 2],
            "episode": [0, 0, 1, 2, 3, 4, 0],
            "uid": ["a", "a", "a", "a", "b", "b", "a"],
            "outcome": [1.0, 1.0, 0.0, 0.5, 0.3, 0.3, 1.0],
        }
    )
    # group a at step 1: 1.0 vs (0 + 0.5) / 2, 0.0 vs 0.75, 0.5 vs 0.5 (tie); group b: a tie; step 2: alone
    labels = paper_report.turn_labels(turns).tolist()
    assert labels[:3] == [1.0, 1.0, 0.0] and all(np.isnan(labels[3:]))


def test_the_reports_auroc_is_sklearns():
    from sklearn.metrics import roc_auc_score

    from paperflow.itpo import paper_report

    rng = np.random.default_rng(0)
    y = rng.random(60) < 0.4
    x = np.round(rng.normal(size=60) + y, 1)  # ties included
    assert paper_report.auroc(y, x) == pytest.approx(roc_auc_score(y, x), abs=1e-12)
    assert np.isnan(paper_report.auroc([True, True], [0.1, 0.2]))


def _log_records(step, outcome, scores, tokens, uid):
    return [
        {
            "step": step,
            "episode": i,
            "uid": uid[i],
            "outcome": outcome[i],
            "tokens": tokens[i],
            "score": scores[i],
            "score_after": scores[i],
        }
        for i in range(len(outcome))
    ]


def test_turn_aurocs_per_step_then_averaged_with_the_length_control(tmp_path):
    from paperflow.itpo import paper_report

    uid = ["a"] * 4
    rows = _log_records(
        1, [1.0, 0.0, 1.0, 0.0], [[0.5, 0.4], [-0.2], [0.3], [-0.1, -0.3]], [[2, 3], [2], [3], [2, 3]], uid
    )
    rows += _log_records(2, [1.0, 0.0, 0.0, 0.0], [[0.1], [0.2], [0.0], [-0.5]], [[1], [1], [1], [1]], uid)
    path = tmp_path / "turns.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    turns = paper_report.read_turn_log(path)
    assert len(turns) == 10 and turns["turn"].tolist()[:2] == [0, 1]
    got = paper_report.turn_aurocs(turns)
    # step 1: every good turn scores above every bad one (1.0); step 2: 0.1 ranks above 0.0 and -0.5, below 0.2
    assert got["score"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert got["steps"] == 2 and got["turns"] == 10  # every episode labelled: no tie with its group
    step1 = turns[turns["step"] == 1]
    labels = paper_report.turn_labels(step1).astype(bool)
    assert got["tokens"] == pytest.approx((paper_report.auroc(labels, step1["tokens"]) + 0.5) / 2)
    empty = tmp_path / "outcome.jsonl"
    empty.write_text("")
    table = paper_report.turn_table({("math", "itponorm", "s0"): str(path), ("math", "outcome", "s0"): str(empty)})
    assert table[["task", "method", "seed"]].values.tolist() == [["math", "itponorm", 0]]


def test_the_paper_reports_turn_length_control_is_the_settings_one():
    """paper_report names the control again (its job's env lacks the lm stack settings imports); the two must agree,
    or the paper-scale claim would look for a method the table does not have."""
    from paperflow.itpo import paper_report, settings

    assert paper_report.TURN_LENGTH_CONTROL == settings.TURN_LENGTH_CONTROL


# --- long jobs resume (issue 43): verl's own switch pointed at the job's checkpoint folder ---
RESUMING_VERL = """
if module == "recipe.itpo.main_prime":
    ckpt = Path(over["trainer.default_local_dir"])
    latest = ckpt / "latest_checkpointed_iteration.txt"
    start = int(latest.read_text()) if over["trainer.resume_mode"] == "auto" and latest.exists() else 0
    import importlib, types
    import torch
    prefix = "+ray_kwargs.ray_init.runtime_env.env_vars."
    os.environ.update({{k[len(prefix):]: v for k, v in over.items() if k.startswith(prefix)}})
    trainer = types.ModuleType("recipe.itpo.prime_ray_trainer")
    trainer.compute_advantage = lambda data, adv_estimator, config: None
    sys.modules[trainer.__name__] = trainer
    hook = over["+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"].rsplit(".", 1)
    getattr(importlib.import_module(hook[0]), hook[1])()
    for step in range(start + 1, 7):  # verl's global steps 1..6, a checkpoint every 2
        if str(step) == os.environ.get("FAKE_DIE_AT"):
            sys.exit(9)
        mask = torch.tensor([[0, 1, 1, 0, 1, 0]] * 8)
        outcome = torch.tensor([1.0, 0.0] * 4)
        scores = (outcome[:, None] - 0.5) * mask
        batch = {{"response_mask": mask, "scores": outcome, "before_update_rm_scores": scores, "rm_scores": scores}}
        data = types.SimpleNamespace(batch=batch, non_tensor_batch={{"uid": [f"p{{i // 4}}" for i in range(8)]}})
        trainer.compute_advantage(data, over["algorithm.adv_estimator"], None)
        if step % 2 == 0:
            (ckpt / f"global_step_{{step}}" / "actor").mkdir(parents=True)
            latest.write_text(str(step))
    sys.exit(0)
"""


def test_a_killed_training_run_resumes_from_verls_latest_checkpoint_in_the_jobs_folder(
    hub, recipe_json, tmp_path, monkeypatch
):
    """train with the job's checkpoint folder: the command turns verl's resume switch on (resume_mode auto) with
    default_local_dir that folder; a run killed at step 5 (after step 4's checkpoint), rerun, continues at step 5,
    the turn log numbers on from 4 (steps 1..6 once each), and the final step moves to the run's checkpoints folder,
    where evaluate reads it."""
    head, tail = FAKE_PYTHON.split('over = dict(a.split("=", 1) for a in args[2:])\n')
    exe = tmp_path / "fake_python"
    exe.write_text(
        (head + 'over = dict(a.split("=", 1) for a in args[2:])\n' + RESUMING_VERL).format(exe=sys.executable)
    )
    exe.chmod(0o755)
    cfg, inputs = _fake_verl_inputs(recipe_json, tmp_path, monkeypatch, _free_port())
    run_json, ckpt = tmp_path / "runs" / "itponorm" / "run.json", tmp_path / "job_ckpt"
    turns = str(run_json.parent / "turns.jsonl")
    monkeypatch.setenv("FAKE_DIE_AT", "5")
    with pytest.raises(RuntimeError, match="verl exited"):
        paper.train(
            "math", "itponorm", [0], cfg, inputs, str(run_json), python=str(exe), turns=turns, checkpoints=str(ckpt)
        )
    command = json.loads((run_json.parent / "command.json").read_text())
    over = dict(a.split("=", 1) for a in command["command"][3:])
    assert over["trainer.resume_mode"] == "auto" and over["trainer.default_local_dir"] == str(ckpt.resolve())
    assert command["resumed_from_step"] == 0 and paper.latest_step(ckpt) == 4
    monkeypatch.delenv("FAKE_DIE_AT")
    run = paper.train(
        "math", "itponorm", [0], cfg, inputs, str(run_json), python=str(exe), turns=turns, checkpoints=str(ckpt)
    )
    command = json.loads((run_json.parent / "command.json").read_text())
    assert command["resumed_from_step"] == 4
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.PAPERFLOW_ITPO_TURN_LOG_START=4" in command["command"]
    assert run["global_step"] == 6 and run["checkpoint"] == str(run_json.parent / "checkpoints" / "global_step_6")
    assert Path(run["checkpoint"]).is_dir() and not (ckpt / "global_step_6").exists()
    steps = pd.Series([json.loads(line)["step"] for line in Path(turns).read_text().splitlines()])
    assert steps.value_counts().sort_index().to_dict() == {s: 8 for s in range(1, 7)}


# --- long jobs resume (issue 43): the evaluation in journalled shards, one evaluator run each ---


def test_the_validation_set_is_cut_into_even_contiguous_shards_of_at_most_shard_prompts():
    shards = paper.eval_shards(10, 4, 2)
    assert [list(s) for s in shards] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]  # 3 shards of 4 at most, even
    assert [len(s) for s in paper.eval_shards(130, 64, 16)] == [44, 43, 43]  # not 64, 64, 2: verl needs a batch
    assert [list(s) for s in paper.eval_shards(5, 64, 2)] == [[0, 1, 2, 3, 4]]
    with pytest.raises(ConfigError, match=r"evaluate.shard_prompts = 20 .* verl.train_batch_size = 16"):
        paper.eval_shards(41, 20, 16)  # 3 shards of 13-14 rows: below the evaluator's train batch
    with pytest.raises(ConfigError, match="evaluate.shard_prompts = 0"):
        paper.eval_shards(10, 0, 1)


def test_a_shards_overrides_replace_data_val_files_only(tmp_path):
    """The shard's command is the evaluation's with data.val_files (in its place, one entry per key) naming the
    shard; data.train_files stays the whole validation file (the evaluator reads only data.val_files)."""
    paths = _paths(tmp_path)
    base = recipe.eval_overrides("math", CFG["tasks"]["math"], "itponorm", CFG["verl"], CFG["simulator"], paths)
    shard = tmp_path / "shards" / "shard-003.parquet"
    got = paper.shard_overrides(base, shard)
    changed = [(b, g) for b, g in zip(base, got, strict=True) if b != g]
    assert changed == [(f"data.val_files=['{paths['validation']}']", f"data.val_files=['{shard.resolve()}']")]
    assert f"data.train_files=['{paths['validation']}']" in got
    assert paper.shard_overrides(got, tmp_path / "other.parquet")[base.index(changed[0][0])].endswith("other.parquet']")
    with pytest.raises(ValueError, match="data.val_files once"):
        paper.shard_overrides([o for o in base if not o.startswith("data.val_files=")], shard)


def _prompt(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def _decoded(user: str) -> str:
    """verl's `input`: the prompt through Qwen's chat template, decoded without its special tokens."""
    return f"system\n{SYSTEM}\nuser\n{user}\nassistant\n"


def test_dumped_rollouts_are_keyed_by_their_rows_index_whatever_order_verl_dumps_them():
    rows = [
        ("id-a", _prompt("help me with problem 1")),
        ("id-b", _prompt("help me with problem 10")),
        ("id-c", _prompt("help me with problem 2")),
        ("id-d", _prompt("a prompt too long for verl")),
    ]
    dump = [
        {"input": _decoded(u), "output": f"{u} #{r}", "score": 0.0}
        for u in ("help me with problem 2", "help me with problem 10", "help me with problem 1")
        for r in range(2)
    ]
    keyed, unscored = collab.key_rollouts(dump, rows, 2)
    # row order, then each row's rollouts in their dumped rank; "problem 1" is part of "problem 10"'s input
    assert [(r["prompt_index"], r["rollout"], r["output"]) for r in keyed] == [
        ("id-a", 0, "help me with problem 1 #0"),
        ("id-a", 1, "help me with problem 1 #1"),
        ("id-b", 0, "help me with problem 10 #0"),
        ("id-b", 1, "help me with problem 10 #1"),
        ("id-c", 0, "help me with problem 2 #0"),
        ("id-c", 1, "help me with problem 2 #1"),
    ]
    assert unscored == ["id-d"]  # verl's filter_overlong_prompts dropped it: no rollout
    assert collab.key_rollouts(dump[::-1], rows, 2)[0] == [
        {**r, "output": r["output"][:-1] + str(1 - r["rollout"])} for r in keyed
    ]  # reversed: same rows in the same order; a row's rollouts keep their dumped rank
    with pytest.raises(ValueError, match="matches no prompt"):
        collab.key_rollouts([*dump, {"input": _decoded("something else"), "output": "", "score": 0}], rows, 2)
    with pytest.raises(ValueError, match="prompt id-c: 1 rollouts in the dump, not the 2 asked"):
        collab.key_rollouts(dump[1:], rows, 2)
    twins = [("x", _prompt("abc")), ("y", _prompt("xyz"))]
    with pytest.raises(ValueError, match="matches rows .* alike"):
        collab.key_rollouts([{"input": "abc xyz", "output": "", "score": 0}], twins, 1)


def _resumable_eval_inputs(recipe_json, tmp_path, monkeypatch):
    """A fake-verl evaluation of 12 validation prompts in 4 shards of 3 (train_batch_size 2), 3 greedy rollouts
    each, on a trained run's global_step_6 (run.json written as train writes it)."""
    exe = tmp_path / "fake_python"
    exe.write_text(FAKE_PYTHON.format(exe=sys.executable))
    exe.chmod(0o755)
    cfg, inputs = _fake_verl_inputs(recipe_json, tmp_path, monkeypatch, _free_port())
    cfg = {**cfg, "verl": {**cfg["verl"], "eval": {**cfg["verl"]["eval"], "n": 3}}, "evaluate": {"shard_prompts": 3}}
    hub = hub_rows(24).to_dict(orient="records")
    collab.rl_splits(hub, SYSTEM, "solving math problems", 0.5, 42)["validation"].to_parquet(inputs["validation"])
    run = {
        "task": "math",
        "method": "itponorm",
        "seed": 0,
        "global_step": 6,
        "checkpoint": str(tmp_path / "runs" / "checkpoints" / "global_step_6"),
    }
    inputs["run"] = str(tmp_path / "runs" / "run.json")
    Path(inputs["run"]).parent.mkdir(parents=True)
    Path(inputs["run"]).write_text(json.dumps(run))
    return exe, cfg, inputs


def test_a_killed_evaluation_reruns_only_the_shards_left_and_writes_what_an_uninterrupted_one_writes(
    hub, recipe_json, tmp_path, monkeypatch
):
    """Killed in its third shard, the evaluation has journalled two in the job's folder; rerun (verl shuffling
    the rows otherwise), it launches the evaluator on shards 2 and 3 only, under one simulator server, and writes
    the rollouts and summary an uninterrupted run writes: every validation row's rollouts, in the file's row order,
    keyed by its `index`. A third call on the finished journal launches nothing."""
    exe, cfg, inputs = _resumable_eval_inputs(recipe_json, tmp_path, monkeypatch)
    launched = tmp_path / "shards.log"  # the fake evaluator's log of the shard files it was given
    calls = tmp_path / "calls.jsonl"

    def outputs(name):
        return {"rollouts": str(tmp_path / name / "r.parquet"), "summary": str(tmp_path / name / "s.json")}

    monkeypatch.setenv("FAKE_DIE_ON", "shard-002.parquet")
    with pytest.raises(RuntimeError, match="verl exited"):
        paper.evaluate("math", "itponorm", cfg, inputs, outputs("killed"), str(exe), checkpoints=str(tmp_path / "ck"))
    assert launched.read_text().split() == ["shard-000.parquet", "shard-001.parquet", "shard-002.parquet"]
    assert not Path(outputs("killed")["summary"]).exists()
    monkeypatch.delenv("FAKE_DIE_ON")
    launched.unlink()
    calls.unlink()
    monkeypatch.setenv("FAKE_SHUFFLE_SEED", "another order")
    resumed = paper.evaluate(
        "math", "itponorm", cfg, inputs, outputs("killed"), str(exe), checkpoints=str(tmp_path / "ck")
    )
    assert launched.read_text().split() == ["shard-002.parquet", "shard-003.parquet"]
    assert [json.loads(c)["module"] for c in calls.read_text().splitlines()] == [
        "vllm.entrypoints.openai.api_server",
        "recipe.itpo.evaluate",
        "recipe.itpo.evaluate",
    ]
    command = json.loads((tmp_path / "killed" / "math_itponorm_s0" / "command.json").read_text())
    assert command["shards"] == [3, 3, 3, 3] and command["resumed_shards"] == [0, 1]

    launched.unlink()
    monkeypatch.setenv("FAKE_SHUFFLE_SEED", "a third order")
    whole = paper.evaluate(
        "math", "itponorm", cfg, inputs, outputs("whole"), str(exe), checkpoints=str(tmp_path / "ck2")
    )
    assert launched.read_text().split() == [f"shard-00{k}.parquet" for k in range(4)]
    assert resumed == whole and resumed["shards"] == 4 and resumed["rollouts"] == 12 * 3
    got, meta = read_frame(outputs("killed")["rollouts"])
    want, _ = read_frame(outputs("whole")["rollouts"])
    pd.testing.assert_frame_equal(got, want)
    assert meta == whole
    validation = pd.read_parquet(inputs["validation"])
    assert got["prompt_index"].tolist() == [i for i in validation["index"] for _ in range(3)]
    assert got["rollout"].tolist() == [0, 1, 2] * 12
    users = [p[-1]["content"] for p in validation["prompt"]]
    assert got["output"].tolist() == [f"assistant: {u}? #{r} user: thanks" for u in users for r in range(3)]

    launched.unlink()
    again = paper.evaluate(
        "math", "itponorm", cfg, inputs, outputs("again"), str(exe), checkpoints=str(tmp_path / "ck")
    )
    assert again == whole and not launched.exists()  # every shard journalled: no evaluator, no server
    pd.testing.assert_frame_equal(read_frame(outputs("again")["rollouts"])[0], want)
    resplit = {**cfg, "evaluate": {"shard_prompts": 4}}  # 3 shards of 4: not the journal's shards
    with pytest.raises(RuntimeError, match="shard 0 holds other rows"):
        paper.evaluate("math", "itponorm", resplit, inputs, outputs("x"), str(exe), checkpoints=str(tmp_path / "ck"))
