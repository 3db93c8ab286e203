"""eapo's DAPO and LUFFY baselines at paper scale, offline: the parquet rows the recipes' datasets read (verl's
RLHFDataset and LUFFY's RLHFDatasetWithTarget: chat messages under `prompt`, `data_source`,
`reward_model.ground_truth`, `extra_info`, LUFFY's `target`), the command lines against the published scripts'
override keys (verl-recipe 48ea0a79 dapo/run_dapo_qwen2.5_32b.sh, LUFFY 01f4ae06 exp_scripts/train.sh; the key lists
below were read from the `fetch`ed scripts) with our values substituted, the config checks, the job's launch and
merge steps against a recording fake interpreter, and LUFFY's checkpoint merge on a tiny model's fake FSDP shards.
verl and LUFFY are not installed here; the recipe's GPU requests are in test_eapo_paper's dry run."""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from paperflow.core.config import ConfigError, load_paper_config
from paperflow.eapo import math_data, paper, recipes

# the override keys of dapo/run_dapo_qwen2.5_32b.sh at verl-recipe 48ea0a797fa29867ea0ad92aff7d284eec7d4be3
DAPO_SCRIPT_KEYS = """data.train_files data.val_files data.prompt_key data.truncation data.max_prompt_length
data.max_response_length data.gen_batch_size data.train_batch_size actor_rollout_ref.rollout.n algorithm.adv_estimator
algorithm.use_kl_in_reward algorithm.kl_ctrl.kl_coef actor_rollout_ref.actor.use_kl_loss
actor_rollout_ref.actor.kl_loss_coef actor_rollout_ref.actor.clip_ratio_low actor_rollout_ref.actor.clip_ratio_high
actor_rollout_ref.actor.clip_ratio_c algorithm.filter_groups.enable algorithm.filter_groups.max_num_gen_batches
algorithm.filter_groups.metric actor_rollout_ref.model.use_remove_padding actor_rollout_ref.actor.use_dynamic_bsz
actor_rollout_ref.ref.log_prob_use_dynamic_bsz actor_rollout_ref.rollout.log_prob_use_dynamic_bsz
actor_rollout_ref.actor.ppo_max_token_len_per_gpu actor_rollout_ref.ref.log_prob_max_token_len_per_gpu
actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu actor_rollout_ref.model.path
actor_rollout_ref.model.enable_gradient_checkpointing actor_rollout_ref.actor.optim.lr
actor_rollout_ref.actor.optim.lr_warmup_steps actor_rollout_ref.actor.optim.weight_decay
actor_rollout_ref.actor.ppo_mini_batch_size actor_rollout_ref.actor.fsdp_config.param_offload
actor_rollout_ref.actor.fsdp_config.optimizer_offload actor_rollout_ref.actor.entropy_coeff
actor_rollout_ref.actor.grad_clip actor_rollout_ref.actor.loss_agg_mode
actor_rollout_ref.actor.ulysses_sequence_parallel_size actor_rollout_ref.rollout.gpu_memory_utilization
actor_rollout_ref.rollout.tensor_model_parallel_size actor_rollout_ref.rollout.enable_chunked_prefill
actor_rollout_ref.rollout.max_num_batched_tokens actor_rollout_ref.rollout.temperature actor_rollout_ref.rollout.top_p
actor_rollout_ref.rollout.top_k actor_rollout_ref.rollout.val_kwargs.temperature actor_rollout_ref.rollout.val_kwargs.top_p
actor_rollout_ref.rollout.val_kwargs.top_k actor_rollout_ref.rollout.val_kwargs.do_sample
actor_rollout_ref.rollout.val_kwargs.n actor_rollout_ref.rollout.name actor_rollout_ref.ref.fsdp_config.param_offload
actor_rollout_ref.ref.ulysses_sequence_parallel_size actor_rollout_ref.actor.fsdp_config.fsdp_size
reward_model.reward_manager reward_model.overlong_buffer.enable reward_model.overlong_buffer.len
reward_model.overlong_buffer.penalty_factor trainer.logger trainer.project_name trainer.experiment_name
trainer.n_gpus_per_node trainer.nnodes trainer.val_before_train trainer.test_freq trainer.save_freq trainer.total_epochs
trainer.default_local_dir trainer.resume_mode""".split()
# the script's reward keys in verl 0.9's spelling (as the recipe's run_dapo_qwen3_8b_base_npu.sh writes them)
DAPO_RENAMED = {
    "reward_model.reward_manager": "reward.reward_manager.name",
    "reward_model.overlong_buffer.enable": "reward.reward_kwargs.overlong_buffer_cfg.enable",
    "reward_model.overlong_buffer.len": "reward.reward_kwargs.overlong_buffer_cfg.len",
    "reward_model.overlong_buffer.penalty_factor": "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
}
# ours beyond the script: the reward file, the seed, the step budget, the manager's max length and its log switch
DAPO_ADDED = {
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
    "data.seed",
    "trainer.total_training_steps",
    "reward.reward_kwargs.max_resp_len",
    "reward.reward_kwargs.overlong_buffer_cfg.log",
}
# the override keys of exp_scripts/train.sh at LUFFY 01f4ae066249e6965ce0d5512ccdf99a12895c74
LUFFY_SCRIPT_KEYS = """algorithm.adv_estimator data.train_files data.val_files data.train_batch_size data.val_batch_size
data.max_prompt_length data.max_response_length actor_rollout_ref.model.path actor_rollout_ref.actor.optim.lr
actor_rollout_ref.model.use_remove_padding actor_rollout_ref.actor.ppo_mini_batch_size
actor_rollout_ref.actor.ppo_micro_batch_size actor_rollout_ref.actor.use_dynamic_bsz
actor_rollout_ref.actor.ppo_max_token_len_per_gpu actor_rollout_ref.actor.kl_loss_coef
actor_rollout_ref.actor.kl_loss_type actor_rollout_ref.actor.ulysses_sequence_parallel_size
actor_rollout_ref.model.enable_gradient_checkpointing actor_rollout_ref.actor.fsdp_config.param_offload
actor_rollout_ref.actor.fsdp_config.grad_offload actor_rollout_ref.actor.fsdp_config.optimizer_offload
actor_rollout_ref.rollout.tensor_model_parallel_size actor_rollout_ref.rollout.name actor_rollout_ref.rollout.temperature
actor_rollout_ref.rollout.val_temperature actor_rollout_ref.rollout.gpu_memory_utilization actor_rollout_ref.rollout.n
actor_rollout_ref.rollout.n_val actor_rollout_ref.ref.fsdp_config.param_offload actor_rollout_ref.rollout.max_prefix_len
algorithm.kl_ctrl.kl_coef actor_rollout_ref.actor.entropy_coeff trainer.critic_warmup trainer.logger
trainer.project_name trainer.experiment_name +trainer.val_before_train trainer.n_gpus_per_node trainer.nnodes
trainer.save_freq trainer.test_freq actor_rollout_ref.actor.use_kl_loss actor_rollout_ref.actor.use_sft_prefix_reward
actor_rollout_ref.rollout.prefix_share_across_samples actor_rollout_ref.rollout.prefix_strategy
actor_rollout_ref.rollout.n_prefix actor_rollout_ref.rollout.min_prefix_ratio actor_rollout_ref.rollout.max_prefix_ratio
actor_rollout_ref.rollout.prefix_reward_weight_alpha actor_rollout_ref.ref.use_ref
actor_rollout_ref.actor.use_off_policy_loss actor_rollout_ref.actor.off_policy_normalize
actor_rollout_ref.actor.off_policy_reshape actor_rollout_ref.actor.off_policy_loss_impl algorithm.grpo_use_std
actor_rollout_ref.actor.loss_remove_token_mean actor_rollout_ref.actor.loss_remove_clip data.reward_impl_version
trainer.max_optim_to_keep data.shuffle trainer.default_hdfs_dir trainer.total_epochs""".split()
PATHS = {
    "model": "/m",
    "train": "/t.parquet",
    "validation": "/v.parquet",
    "checkpoints": "/c",
    "name": "run",
    "reward": "/r.py",
}


def cfg():
    return copy.deepcopy(load_paper_config("eapo", "paper"))


def as_dict(overrides):
    out = dict(o.split("=", 1) for o in overrides)
    assert len(out) == len(overrides), "a key appears twice"
    return out


def frame():
    return pd.DataFrame(
        {"problem_id": [3, 5, 8], "problem": ["1 + 1?", "x^2 = 4, x > 0?", "2 + 2?"], "answer": ["2", "2", "4"]}
    )


# --- data ---------------------------------------------------------------------------------------------------------
def test_rows_hold_what_verl_and_luffy_read_and_the_chat_renders_our_prompt(tmp_path):
    template = cfg()["math"]["prompt_template"]
    path = tmp_path / "rows.parquet"
    recipes.verl_rows(frame(), template, "train").to_parquet(path, index=False)
    back = pd.read_parquet(path)  # as verl's RLHFDataset reads it (pandas / datasets over parquet)
    assert set(back.columns) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for i, row in back.iterrows():
        messages = [dict(m) for m in row["prompt"]]
        assert [m["role"] for m in messages] == ["system", "user"]
        # Qwen2.5's chat template with add_generation_prompt gives exactly the prompt the TRL arms train on
        assert recipes.render_chatml(messages) == math_data.prompt(template, frame()["problem"][i])
        assert row["reward_model"]["ground_truth"] == frame()["answer"][i]
        assert row["data_source"] == recipes.DATA_SOURCE
        assert row["extra_info"]["problem_id"] == frame()["problem_id"][i] and row["extra_info"]["index"] == i


def test_luffy_rows_carry_pi_e_first_correct_trace_as_target(tmp_path):
    template = cfg()["math"]["prompt_template"]
    traces = pd.DataFrame(
        {
            "problem_id": [3, 3, 5, 5, 8],
            "sample": [0, 1, 0, 1, 0],
            "trace": ["a", "b \\boxed{2}", "c", "d", "e"],
            "correct": [0.0, 1.0, 0.0, 0.0, 1.0],
        }
    )
    rows, dropped = recipes.luffy_rows(frame(), traces, template, "train")
    path = tmp_path / "luffy.parquet"
    rows.to_parquet(path, index=False)
    back = pd.read_parquet(path)
    assert dropped == 1 and list(back["extra_info"].map(lambda e: e["problem_id"])) == [3, 8]
    # rl_dataset_with_target.py: tgt = row_dict.pop('target'); tgt = tgt[0]; tgt['content']
    assert [r[0]["content"] for r in back["target"]] == ["b \\boxed{2}", "e"]
    assert {r[0]["role"] for r in back["target"]} == {"assistant"}
    val = recipes.verl_rows(frame(), template, "test", [None] * 3)
    val.to_parquet(path, index=False)
    assert pd.read_parquet(path)["target"].isna().all()  # `if tgt is not None` in LUFFY's reader


def test_a_template_that_is_not_chatml_is_refused():
    with pytest.raises(ConfigError, match="ChatML"):
        recipes.chat_messages("Q: {problem} A:", "1 + 1")


def test_dapos_reward_file_scores_like_the_trl_arms(monkeypatch):
    import types

    mod = types.ModuleType("math_verify")
    mod.parse = lambda t: t.strip("$")
    mod.verify = lambda g, p: g == p
    monkeypatch.setitem(sys.modules, "math_verify", mod)
    from paperflow.eapo import verl_reward

    assert verl_reward.compute_score("eapo_math", "so \\boxed{4}", "4", {}) == {"score": 1.0, "acc": 1.0}
    assert verl_reward.compute_score("eapo_math", "Answer: 4", "4") == {"score": 0.0, "acc": 0.0}


# --- command lines ------------------------------------------------------------------------------------------------
def test_dapo_command_is_the_recipes_with_ours_substituted():
    c = cfg()
    got = as_dict(recipes.dapo_overrides(c, PATHS, seed=7))
    assert set(got) == {DAPO_RENAMED.get(k, k) for k in DAPO_SCRIPT_KEYS} | DAPO_ADDED
    rl, r = c["rl"], c["math"]["recipes"]["dapo"]
    resp = c["math"]["trl"]["max_completion_length"]
    assert got["algorithm.filter_groups.enable"] == "True" and got["algorithm.filter_groups.metric"] == "acc"
    assert got["algorithm.filter_groups.max_num_gen_batches"] == str(r["max_num_gen_batches"])
    assert (got["actor_rollout_ref.actor.clip_ratio_low"], got["actor_rollout_ref.actor.clip_ratio_high"]) == (
        "0.2",
        "0.28",
    )
    assert got["actor_rollout_ref.actor.loss_agg_mode"] == "token-mean"
    assert got["algorithm.use_kl_in_reward"] == got["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert got["reward.reward_manager.name"] == "dapo"
    assert got["reward.reward_kwargs.overlong_buffer_cfg.enable"] == "True"
    assert got["reward.reward_kwargs.overlong_buffer_cfg.len"] == str(r["overlong_buffer_len"])
    assert got["reward.reward_kwargs.max_resp_len"] == got["data.max_response_length"] == str(resp)
    assert got["data.train_batch_size"] == str(rl["prompts_per_step"])
    assert got["data.gen_batch_size"] == str(rl["prompts_per_step"] * r["gen_batch_factor"])
    assert got["actor_rollout_ref.rollout.n"] == str(rl["group_size"])
    assert got["trainer.total_training_steps"] == str(rl["steps"]) and got["data.seed"] == "7"
    assert got["trainer.n_gpus_per_node"] == str(c["resources"]["train_gpus"]) and got["trainer.nnodes"] == "1"
    assert got["reward.custom_reward_function.path"] == "/r.py"
    assert got["data.train_files"] == "/t.parquet" and got["actor_rollout_ref.model.path"] == "/m"
    assert Path(recipes.REWARD_FILE).is_file()


def test_luffy_command_is_train_sh_with_ours_substituted():
    c = cfg()
    got = as_dict(recipes.luffy_overrides(c, PATHS))
    # ours beyond train.sh: the step budget and the checkpoint folder (train.sh keeps verl's default)
    assert set(got) == set(LUFFY_SCRIPT_KEYS) | {"trainer.total_training_steps", "trainer.default_local_dir"}
    resp = str(c["math"]["trl"]["max_completion_length"])
    assert got["actor_rollout_ref.actor.use_off_policy_loss"] == "True"
    assert got["actor_rollout_ref.actor.off_policy_reshape"] == "p_div_p_0.1"  # f(p) = p / (p + 0.1), spec 2.1
    assert got["actor_rollout_ref.rollout.n_prefix"] == "1" and got["actor_rollout_ref.rollout.max_prefix_len"] == resp
    assert got["data.reward_impl_version"] == "4"  # math-verify without the think format (train.sh: 3)
    assert got["data.max_response_length"] == resp
    assert got["data.train_batch_size"] == str(c["rl"]["prompts_per_step"])
    assert got["trainer.total_training_steps"] == str(c["rl"]["steps"])


def test_resumable_commands_carry_the_job_folder_resume_mode_auto_and_save_freq():
    c = cfg()
    for method, build in (
        ("dapo", lambda r: recipes.dapo_overrides(c, PATHS, 0, resume=r)),
        ("luffy", lambda r: recipes.luffy_overrides(c, PATHS, resume=r)),
    ):
        old, got = as_dict(build(False)), as_dict(build(True))
        assert got["trainer.default_local_dir"] == PATHS["checkpoints"] and got["trainer.resume_mode"] == "auto"
        assert got["trainer.save_freq"] == str(c["math"]["recipes"][method]["save_freq"])
        # a checkpoint at least every 30 min at the step time the job's limit implies, and one at the last step
        minutes = c["resources"]["train_runtime_min"] / c["rl"]["steps"]
        assert int(got["trainer.save_freq"]) * minutes <= 30 and c["rl"]["steps"] % int(got["trainer.save_freq"]) == 0
        # resume=False is the command as before: verl's resume off (DAPO), LUFFY's key not named
        assert old.get("trainer.resume_mode") == ("disable" if method == "dapo" else None)
        extra = {"trainer.resume_mode"} | ({"trainer.max_actor_ckpt_to_keep"} if method == "dapo" else set())
        assert set(got) - set(old) == extra - set(old) and {k: got[k] for k in old if k not in extra} == {
            k: v for k, v in old.items() if k not in extra
        }
    assert as_dict(recipes.dapo_overrides(c, PATHS, 0, resume=True))["trainer.max_actor_ckpt_to_keep"] == "2"
    assert as_dict(recipes.luffy_overrides(c, PATHS, resume=True))["trainer.max_optim_to_keep"] == "2"  # train.sh's


# --- config -------------------------------------------------------------------------------------------------------
def test_the_paper_config_runs_dapo_and_luffy():
    c = cfg()
    assert {"dapo", "luffy"} <= set(c["methods"])
    paper.check(c)  # no refusal by name any more


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["math"]["recipes"]["repos"]["luffy"].update(commit="main"), "repos.luffy.commit"),
        (lambda c: c["math"]["recipes"]["dapo"].update(save_freq=300), "dapo.save_freq 300 does not divide"),
        # 10 steps at 2880 min / 500 steps = 57.6 min between checkpoints
        (lambda c: c["math"]["recipes"]["luffy"].update(save_freq=10), "luffy.save_freq 10: at the pace"),
        (lambda c: c["math"]["recipes"]["luffy"].update(ppo_mini_batch_size=100), "luffy.ppo_mini_batch_size"),
        (lambda c: c["math"]["recipes"]["dapo"].update(overlong_buffer_len=4096), "overlong_buffer_len"),
        (lambda c: c["math"]["recipes"].update(validation="aime26"), "'aime26' is not in math.datasets"),
        (lambda c: c["math"].pop("recipes"), "math.recipes block"),
    ],
)
def test_recipe_config_errors_name_the_key(edit, message):
    c = cfg()
    edit(c)
    with pytest.raises(ConfigError, match=message):
        paper.check(c)


# --- the job: launch, final checkpoint, merge -------------------------------------------------------------------
FAKE = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({{"argv": args, "cwd": os.getcwd(), "pythonpath": os.environ.get("PYTHONPATH", ""),
                        "attn": os.environ.get("VLLM_ATTENTION_BACKEND")}}) + "\\n")
if args[1] in ("recipe.dapo.main_dapo", "verl.mix_src.main_mix_ppo"):
    kv = dict(a.split("=", 1) for a in args[2:])
    ckpt = Path(kv["trainer.default_local_dir"]); step = kv["trainer.total_training_steps"]
    actor = ckpt / f"global_step_{{step}}" / "actor"; actor.mkdir(parents=True)
    (actor / "model_world_size_2_rank_0.pt").write_text(""); (actor / "model_world_size_2_rank_1.pt").write_text("")
    (ckpt / "latest_checkpointed_iteration.txt").write_text(os.environ.get("FAKE_STEP", step))
else:
    target = Path(args[args.index("--target_dir") + 1] if "--target_dir" in args else args[4])
    target.mkdir(parents=True); (target / "config.json").write_text("{{}}")
"""


@pytest.fixture
def job(tmp_path, monkeypatch):
    fake = tmp_path / "fakepython"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    luffy = tmp_path / "luffy_repo"
    (luffy / "luffy" / "verl" / "verl" / "mix_src").mkdir(parents=True)
    (luffy / "luffy" / "verl" / "verl" / "mix_src" / "main_mix_ppo.py").write_text("")
    tree = tmp_path / "dapo_tree"
    (tree / "recipe" / "dapo").mkdir(parents=True)
    (tree / "recipe" / "dapo" / "main_dapo.py").write_text("")
    (tmp_path / "source.json").write_text(json.dumps({"dapo_tree": str(tree), "luffy": {"folder": str(luffy)}}))
    (tmp_path / "pretrained.json").write_text(json.dumps({"folder": str(tmp_path / "base")}))
    linked = []
    monkeypatch.setattr(recipes, "link_verl_config", lambda t: linked.append(t))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "calls.jsonl"))
    inputs = {
        "start": str(tmp_path / "pretrained.json"),
        "recipes": str(tmp_path / "source.json"),
        "train": str(tmp_path / "train.parquet"),
        "validation": str(tmp_path / "val.parquet"),
    }
    c = cfg()
    c["math"]["recipes"]["luffy"]["python"] = str(fake)
    return {
        "fake": str(fake),
        "inputs": inputs,
        "cfg": c,
        "tmp": tmp_path,
        "tree": tree,
        "luffy": luffy,
        "linked": linked,
    }


def calls(tmp):
    return [json.loads(line) for line in (tmp / "calls.jsonl").read_text().splitlines()]


def test_dapo_job_runs_the_recipe_then_verls_merger(job):
    out = job["tmp"] / "models" / "dapo" / "seed0.json"
    doc = recipes.train("dapo", 0, job["cfg"], job["inputs"], str(out), python=job["fake"])
    train_call, merge_call = calls(job["tmp"])
    work = out.with_name("seed0_work")  # the job's own copy of the recipe tree
    assert train_call["argv"][:2] == ["-m", "recipe.dapo.main_dapo"] and train_call["cwd"] == str(work)
    assert (work / "recipe" / "dapo" / "main_dapo.py").is_file()
    paths = {
        "model": str(job["tmp"] / "base"),
        "validation": job["inputs"]["validation"],
        "reward": str(recipes.REWARD_FILE),
        "checkpoints": str(out.with_name("seed0_checkpoints")),
        "name": "eapo-dapo-seed0",
        "train": job["inputs"]["train"],
    }
    assert train_call["argv"][2:] == recipes.dapo_overrides(job["cfg"], paths, 0)
    assert job["linked"] == [work]  # verl's configs beside the recipe (its hydra searchpath)
    steps = job["cfg"]["rl"]["steps"]
    actor = out.with_name("seed0_checkpoints") / f"global_step_{steps}" / "actor"
    assert merge_call["argv"] == [
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor),
        "--target_dir",
        str(out.with_suffix("")),
    ]
    assert json.loads(out.read_text())["folder"] == doc["folder"] == str(out.with_suffix(""))
    assert paper.model_folder(str(out)) == str(out.with_suffix(""))  # what eapo_evaluate reads


def test_luffy_job_runs_in_luffys_python_and_tree(job):
    out = job["tmp"] / "models" / "luffy" / "seed1.json"
    recipes.train("luffy", 1, job["cfg"], job["inputs"], str(out), python="/not/used")
    train_call, merge_call = calls(job["tmp"])
    assert train_call["argv"][:2] == ["-m", "verl.mix_src.main_mix_ppo"]
    assert train_call["cwd"] == str(job["luffy"] / "luffy" / "verl") and train_call["attn"] == "XFORMERS"
    assert train_call["pythonpath"].split(os.pathsep)[:2] == [
        str(job["luffy"] / "luffy" / "verl"),
        str(job["luffy"] / "luffy"),
    ]
    assert merge_call["argv"][:3] == ["-m", "paperflow.eapo.recipes", "merge"]
    assert (out.with_suffix("") / "config.json").is_file()


def test_a_run_without_its_final_checkpoint_is_refused_and_luffy_runs_in_its_envs_python(job, monkeypatch):
    monkeypatch.setenv("FAKE_STEP", "3")
    with pytest.raises(RuntimeError, match="last checkpoint is step 3"):
        recipes.train("dapo", 0, job["cfg"], job["inputs"], str(job["tmp"] / "m" / "dapo.json"), python=job["fake"])
    job["cfg"]["math"]["recipes"]["luffy"]["python"] = None  # the rule's env is LUFFY's: this interpreter
    assert recipes.luffy_python(job["cfg"]) == sys.executable
    job["cfg"]["math"]["recipes"]["luffy"]["python"] = "/opt/luffy/bin/python"
    assert recipes.luffy_python(job["cfg"]) == "/opt/luffy/bin/python"


# verl's (and LUFFY's) trainer as far as resuming goes: resume_mode auto starts after the tracker's step, every
# save_freq-th step (and, for DAPO's verl, the last) writes global_step_<N>/actor and then the tracker; each trained
# step is logged; FAKE_DIE_AT kills it after that step, as a time limit would
FAKE_VERL = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({{"argv": args}}) + "\\n")
if args[1] in ("recipe.dapo.main_dapo", "verl.mix_src.main_mix_ppo"):
    kv = dict(a.split("=", 1) for a in args[2:])
    ckpt = Path(kv["trainer.default_local_dir"]); total = int(kv["trainer.total_training_steps"])
    every = int(kv["trainer.save_freq"]); tracker = ckpt / "latest_checkpointed_iteration.txt"
    auto = kv.get("trainer.resume_mode", "auto") == "auto"  # LUFFY's fork defaults to auto
    start = int(tracker.read_text()) if auto and tracker.is_file() else 0
    for step in range(start + 1, total + 1):
        with open(os.environ["FAKE_STEPS"], "a") as f:
            f.write(f"{{step}}\\n")
        if step % every == 0 or (args[1] == "recipe.dapo.main_dapo" and step == total):
            actor = ckpt / f"global_step_{{step}}" / "actor"; actor.mkdir(parents=True, exist_ok=True)
            (actor / "model_world_size_1_rank_0.pt").write_text(str(step))
            tracker.write_text(str(step))
        if step == int(os.environ.get("FAKE_DIE_AT", "0")):
            sys.exit(137)
else:
    target = Path(args[args.index("--target_dir") + 1] if "--target_dir" in args else args[4])
    actor = Path(args[args.index("--local_dir") + 1] if "--local_dir" in args else args[3])
    target.mkdir(parents=True); (target / "config.json").write_text((actor / "model_world_size_1_rank_0.pt").read_text())
"""


@pytest.mark.parametrize("method", ["dapo", "luffy"])
def test_a_recipe_run_cut_part_way_resumes_from_its_last_checkpoint_in_the_jobs_folder(job, monkeypatch, method):
    """eapo_train_dapo / eapo_train_luffy with the job's checkpoint folder: killed after step 12 (save_freq 5: the
    last checkpoint is step 10), the rerun trains steps 11..20 only and writes what an uninterrupted run writes; a
    rerun that finds the final step's checkpoint (killed in the merge) trains nothing and merges."""
    fake = job["tmp"] / "fakeverl"
    fake.write_text(FAKE_VERL.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    c = job["cfg"]
    c["rl"]["steps"] = 20
    c["math"]["recipes"][method]["save_freq"] = 5
    c["math"]["recipes"]["luffy"]["python"] = str(fake)

    def run(name, die_at=None):
        steps = job["tmp"] / f"{name}.steps"
        monkeypatch.setenv("FAKE_STEPS", str(steps))
        monkeypatch.setenv("FAKE_DIE_AT", str(die_at or 0))
        out = job["tmp"] / name / "models" / method / "seed0.json"
        ckpt = job["tmp"] / name / "ckpt"
        try:
            doc = recipes.train(method, 0, c, job["inputs"], str(out), python=str(fake), checkpoints=ckpt)
        except RuntimeError:
            doc = None
        trained = [int(x) for x in steps.read_text().split()] if steps.is_file() else []
        steps.unlink(missing_ok=True)
        return doc, trained, out

    whole, trained, out = run("whole")
    assert trained == list(range(1, 21)) and whole["resumed_from_step"] == 0
    argv = calls(job["tmp"])[0]["argv"]
    assert f"trainer.default_local_dir={job['tmp'] / 'whole' / 'ckpt'}" in argv and "trainer.resume_mode=auto" in argv
    assert "trainer.save_freq=5" in argv
    assert (out.with_suffix("") / "config.json").read_text() == "20"  # the final step's weights, merged

    cut, trained, _ = run("cut", die_at=12)
    assert cut is None and trained == list(range(1, 13))
    assert recipes.latest_step(job["tmp"] / "cut" / "ckpt") == 10
    again, trained, out2 = run("cut")
    assert trained == list(range(11, 21)), "the rerun trains only the steps after the last checkpoint"
    assert again["resumed_from_step"] == 10
    assert (out2.with_suffix("") / "config.json").read_text() == (out.with_suffix("") / "config.json").read_text()
    assert {k: v for k, v in again.items() if k != "resumed_from_step"} == json.loads(
        json.dumps({k: v for k, v in whole.items() if k != "resumed_from_step"}).replace("/whole/", "/cut/")
    )

    n = len(calls(job["tmp"]))
    done, trained, _ = run("cut")  # the final checkpoint is there (say the merge was cut): no step is trained
    assert trained == [] and done["resumed_from_step"] == 20
    assert [c["argv"][1] for c in calls(job["tmp"])[n:]] == [
        "verl.model_merger" if method == "dapo" else "paperflow.eapo.recipes"
    ]


def test_luffys_fsdp_shards_merge_back_to_the_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from paperflow.core.lm.models import build_model
    from paperflow.core.lm.tokenizer import save_tokenizer, word_level_tokenizer

    tok = word_level_tokenizer(["1", "2", "+"])
    spec = {
        "arch": "llama",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
    }
    model = build_model({**spec, "vocab_size": len(tok)}, seed=0)
    actor = tmp_path / "global_step_2" / "actor"
    recipes.write_fsdp_shards(model, actor, world_size=2)
    save_tokenizer(tok, actor / "huggingface")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    assert recipes.final_actor(tmp_path, 2) == actor
    with pytest.raises(RuntimeError, match="not the run's final step 5"):
        recipes.final_actor(tmp_path, 5)
    out = recipes.merge_fsdp_shards(actor, tmp_path / "hf", dtype="float32")
    merged = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    want = model.state_dict()
    for k, v in merged.state_dict().items():
        assert torch.equal(v, want[k]), k
    (actor / "model_world_size_2_rank_1.pt").unlink()
    with pytest.raises(FileNotFoundError, match="missing shards"):
        recipes.merge_fsdp_shards(actor, tmp_path / "hf2")


def test_pi_e_traces_become_luffys_training_rows_on_a_tiny_model(tmp_path, monkeypatch):
    """eapo_recipe_data, eapo_prior_traces and eapo_luffy_data end to end on the CPU: a tiny model's samples scored
    by the reward (a fake math-verify), the first correct one per problem as LUFFY's target."""
    import types

    from paperflow.core.io import write_frame
    from paperflow.core.lm.models import build_model, save_model
    from paperflow.core.lm.tokenizer import save_tokenizer, word_level_tokenizer

    mod = types.ModuleType("math_verify")
    mod.parse = lambda t: t.strip("$")
    mod.verify = lambda g, p: g == p
    monkeypatch.setitem(sys.modules, "math_verify", mod)
    boxes = ["\\boxed{2}", "\\boxed{4}"]
    tok = word_level_tokenizer(["Q:", "A:", "1", "2", "+", *boxes])
    spec = {
        "arch": "llama",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 32,
    }
    folder = tmp_path / "prior"
    save_model(build_model({**spec, "vocab_size": len(tok)}, seed=0), folder)
    save_tokenizer(tok, folder)
    (tmp_path / "prior.json").write_text(json.dumps({"folder": str(folder)}))
    template = cfg()["math"]["prompt_template"]
    data = frame().assign(prompt=["Q: 1 + 1 A:", "Q: 2 A:", "Q: 2 + 2 A:"])
    write_frame(tmp_path / "train.parquet", data)
    outs = {k: str(tmp_path / f"{k}.parquet") for k in ("dapo_train", "validation", "luffy_validation")}
    assert paper.recipe_data(str(tmp_path / "train.parquet"), str(tmp_path / "train.parquet"), template, outs) == {
        "train": 3,
        "validation": 3,
    }
    assert "target" in pd.read_parquet(outs["luffy_validation"]) and "target" not in pd.read_parquet(outs["validation"])
    evaluation = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 3, "batch_size": 8, "seed": 0}
    counts = paper.prior_traces(
        str(tmp_path / "prior.json"),
        str(tmp_path / "train.parquet"),
        4,
        evaluation,
        "cpu",
        "float32",
        [],
        str(tmp_path / "traces.parquet"),
    )
    traces = pd.read_parquet(tmp_path / "traces.parquet")
    assert len(traces) == 12 and counts["problems"] == 3
    for t, pid in zip(traces["trace"], traces["problem_id"]):  # the reward's rule, on each sample
        answer = dict(zip(frame()["problem_id"], frame()["answer"]))[pid]
        assert traces.loc[(traces["trace"] == t) & (traces["problem_id"] == pid), "correct"].iloc[0] == float(
            t.rsplit("\\boxed{", 1)[-1].split("}")[0] == answer if "\\boxed{" in t else 0.0
        )
    done = paper.luffy_data(
        str(tmp_path / "train.parquet"),
        str(tmp_path / "traces.parquet"),
        template,
        str(tmp_path / "luffy_train.parquet"),
    )
    rows = pd.read_parquet(tmp_path / "luffy_train.parquet")
    assert done == {"rows": len(rows), "dropped": 3 - len(rows)} and counts["solved"] == len(rows)
    assert 0 < len(rows) < 3, "seed 0 solves some problems and not others: both paths are exercised"
    for row in rows.itertuples():
        pid = row.extra_info["problem_id"]
        first = traces[(traces["problem_id"] == pid) & (traces["correct"] == 1.0)]["trace"].iloc[0]
        assert row.target[0]["content"] == first


def _repo(root: Path, files: dict[str, str]) -> str:
    import subprocess

    def git(*args):
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout

    root.mkdir(parents=True)
    git("init", "-q")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git("add", "-A")
    git("commit", "-q", "-m", "c")
    return git("rev-parse", "HEAD").strip()


def test_the_recipes_are_checked_out_at_their_commits_and_laid_out_as_verl_runs_them(tmp_path, monkeypatch):
    rec_sha = _repo(
        tmp_path / "src" / "recipe",
        {"dapo/main_dapo.py": "# DAPO\n", "dapo/config/dapo_trainer.yaml": "", "other/x.py": ""},
    )
    luffy_sha = _repo(tmp_path / "src" / "luffy", {"luffy/verl/verl/mix_src/main_mix_ppo.py": "", "luffy/x": ""})
    repos = {
        "verl_recipe": {"git": (tmp_path / "src" / "recipe").as_uri(), "commit": rec_sha},
        "luffy": {"git": (tmp_path / "src" / "luffy").as_uri(), "commit": luffy_sha},
    }
    doc = recipes.download(repos, str(tmp_path / "cache"), str(tmp_path / "source.json"))
    tree = Path(doc["dapo_tree"])
    assert (tree / "recipe" / "dapo" / "main_dapo.py").read_text() == "# DAPO\n"
    assert (tree / "recipe" / "__init__.py").is_file() and not (tree / "recipe" / "other").exists()
    assert doc["luffy"]["commit"] == luffy_sha and json.loads((tmp_path / "source.json").read_text()) == {
        "folder": str(tree),
        **doc,
    }
    # verl's configs beside the recipe, as its hydra searchpath (file://verl/trainer/config) reads them
    fake = tmp_path / "site" / "verl"
    (fake / "trainer" / "config" / "actor").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "trainer" / "config" / "ppo_trainer.yaml").write_text("a: 1\n")
    (fake / "trainer" / "config" / "actor" / "dp_actor.yaml").write_text("b: 2\n")
    (fake / "trainer" / "config" / "config.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    dest = recipes.link_verl_config(tree)
    assert dest == tree / "verl" / "trainer" / "config" and (dest / "actor" / "dp_actor.yaml").is_file()
    assert (dest / "ppo_trainer.yaml").read_text() == "a: 1\n" and not (dest / "config.py").exists()
    with pytest.raises(RuntimeError, match="not verl-recipe"):
        recipes.assemble_dapo(tmp_path / "src" / "luffy", tmp_path / "t2")
