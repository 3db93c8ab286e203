"""The DAPO and LUFFY baselines at paper scale, run with the recipes their authors published instead of TRL (which
has no dynamic sampling and no LUFFY loss): verl's DAPO recipe (verl-project/verl-recipe `dapo/`, on PyPI verl
0.9.1, envs/lm-verl.yaml) and LUFFY's verl fork (ElliottYan/LUFFY, its own stack), each at a pinned commit.

This module builds what the two trainers read and the command lines they run, from eapo's config:
- the parquet rows their datasets read (verl's RLHFDataset / LUFFY's RLHFDatasetWithTarget): `prompt` (chat
  messages, rendered by the tokenizer's chat template into exactly our prompt string), `data_source`, `ability`,
  `reward_model.{style, ground_truth}`, `extra_info.{split, index, problem_id}`; LUFFY's rows add `target`, a list
  with one assistant message: pi_E's trace (our experience prior as LUFFY's off-policy guide);
- the Hydra overrides of `dapo/run_dapo_qwen2.5_32b.sh` (full DAPO, the README's reproduction run; its reward keys
  in verl 0.9's `reward.*` spelling, as the recipe's own newer scripts write them) and of LUFFY's
  `exp_scripts/train.sh`, with our model, data, batch sizes, lengths, steps and GPU count substituted
  (`DAPO_FIXED` / `LUFFY_FIXED` keep the scripts' other values);
- the final checkpoint as a Hugging Face folder the evaluate rule reads: verl's own model merger for DAPO
  (`python -m verl.model_merger merge --backend fsdp`), `merge_fsdp_shards` for LUFFY's fork (which has no merger:
  the same Shard(0) concatenation of each rank's local tensor, then save_pretrained).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.resume import EVERY_S

RECIPE_METHODS = ("dapo", "luffy")
# a resumable run checkpoints at least this often (README, "Long jobs resume"); save_freq is checked against the
# step time the job's own limit implies (resources.train_runtime_min / rl.steps), no step having been timed yet
CHECKPOINT_EVERY_MIN = EVERY_S / 60
DAPO_MODULE = "recipe.dapo.main_dapo"  # verl-recipe's dapo/ placed as recipe/dapo (verl's submodule layout)
LUFFY_MODULE = "verl.mix_src.main_mix_ppo"  # run from LUFFY's luffy/verl (train.sh: cd $ROOT/luffy/verl)
MERGER_MODULE = "verl.model_merger"
REWARD_FILE = Path(__file__).with_name("verl_reward.py")  # DAPO's custom_reward_function (math-verify, ours)
DATA_SOURCE = "eapo_math"  # not one of verl's/LUFFY's built-in sources: the custom reward / LUFFY's version 4 score it
CHATML = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)(?:<\|im_end\|>\n|$)", re.S)

# run_dapo_qwen2.5_32b.sh at verl-recipe 48ea0a79, the values ours do not replace (dapo_overrides substitutes
# the rest); the reward manager and overlong keys as run_dapo_qwen3_8b_base_npu.sh spells them for verl 0.9
DAPO_FIXED: tuple[tuple[str, str], ...] = (
    ("data.prompt_key", "prompt"),
    ("data.truncation", "left"),
    ("algorithm.adv_estimator", "grpo"),
    ("algorithm.use_kl_in_reward", "False"),
    ("algorithm.kl_ctrl.kl_coef", "0.0"),
    ("actor_rollout_ref.actor.use_kl_loss", "False"),
    ("actor_rollout_ref.actor.kl_loss_coef", "0.0"),
    ("actor_rollout_ref.actor.clip_ratio_c", "10.0"),
    ("algorithm.filter_groups.enable", "True"),
    ("algorithm.filter_groups.metric", "acc"),
    ("actor_rollout_ref.model.use_remove_padding", "True"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "True"),
    ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "True"),
    ("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", "True"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", "True"),
    ("actor_rollout_ref.actor.optim.lr_warmup_steps", "10"),
    ("actor_rollout_ref.actor.optim.weight_decay", "0.1"),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", "True"),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "True"),
    ("actor_rollout_ref.actor.entropy_coeff", "0"),
    ("actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
    ("actor_rollout_ref.rollout.enable_chunked_prefill", "True"),
    ("actor_rollout_ref.rollout.top_p", "1.0"),
    ("actor_rollout_ref.rollout.top_k", "-1"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p", "0.7"),
    ("actor_rollout_ref.rollout.val_kwargs.top_k", "-1"),
    ("actor_rollout_ref.rollout.val_kwargs.do_sample", "True"),
    ("actor_rollout_ref.rollout.val_kwargs.n", "1"),
    ("actor_rollout_ref.rollout.name", "vllm"),
    ("actor_rollout_ref.ref.fsdp_config.param_offload", "True"),
    ("actor_rollout_ref.actor.fsdp_config.fsdp_size", "-1"),
    ("reward.reward_manager.name", "dapo"),
    ("reward.reward_kwargs.overlong_buffer_cfg.enable", "True"),
    ("reward.reward_kwargs.overlong_buffer_cfg.log", "False"),
    ("trainer.nnodes", "1"),
)

# exp_scripts/train.sh at LUFFY 01f4ae06, the values ours do not replace (luffy_overrides substitutes the rest)
LUFFY_FIXED: tuple[tuple[str, str], ...] = (
    ("algorithm.adv_estimator", "grpo"),
    ("data.val_batch_size", "512"),
    ("actor_rollout_ref.model.use_remove_padding", "True"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "64"),
    ("actor_rollout_ref.actor.use_dynamic_bsz", "True"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "32768"),
    ("actor_rollout_ref.actor.kl_loss_coef", "0.00"),
    ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "1"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", "True"),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", "False"),
    ("actor_rollout_ref.actor.fsdp_config.grad_offload", "False"),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "False"),
    ("actor_rollout_ref.rollout.name", "vllm"),
    ("actor_rollout_ref.rollout.val_temperature", "0.6"),
    ("actor_rollout_ref.rollout.n_val", "1"),
    ("actor_rollout_ref.ref.fsdp_config.param_offload", "True"),
    ("algorithm.kl_ctrl.kl_coef", "0.000"),
    ("actor_rollout_ref.actor.entropy_coeff", "0.001"),
    ("trainer.critic_warmup", "0"),
    ("+trainer.val_before_train", "False"),
    ("trainer.nnodes", "1"),
    ("actor_rollout_ref.actor.use_kl_loss", "False"),
    ("actor_rollout_ref.actor.use_sft_prefix_reward", "False"),
    ("actor_rollout_ref.rollout.prefix_share_across_samples", "False"),
    ("actor_rollout_ref.rollout.prefix_strategy", "random"),
    ("actor_rollout_ref.rollout.n_prefix", "1"),
    ("actor_rollout_ref.rollout.min_prefix_ratio", "1.0"),
    ("actor_rollout_ref.rollout.max_prefix_ratio", "1.0"),
    ("actor_rollout_ref.rollout.prefix_reward_weight_alpha", "1.0"),
    ("actor_rollout_ref.ref.use_ref", "False"),
    ("actor_rollout_ref.actor.use_off_policy_loss", "True"),
    ("actor_rollout_ref.actor.off_policy_normalize", "False"),
    ("actor_rollout_ref.actor.off_policy_reshape", "p_div_p_0.1"),
    ("actor_rollout_ref.actor.off_policy_loss_impl", "token"),
    ("algorithm.grpo_use_std", "False"),
    ("actor_rollout_ref.actor.loss_remove_token_mean", "True"),
    ("actor_rollout_ref.actor.loss_remove_clip", "True"),
    ("trainer.max_optim_to_keep", "2"),
    ("data.shuffle", "True"),
    ("trainer.default_hdfs_dir", "null"),
)
LUFFY_ENV = {"VLLM_ATTENTION_BACKEND": "XFORMERS"}  # train.sh's export ("to avoid CUDA errors")
# with resume, verl 0.9 keeps the last two checkpoints (a checkpoint cut off mid-save still leaves the one before)
KEEP_CHECKPOINTS = 2
# train.sh's data.reward_impl_version=3 is math-verify after a `</think>` (its model thinks); our base model and
# prompt have no think block, so version 4, LUFFY's same math-verify reward without the think format
LUFFY_REWARD_IMPL_VERSION = "4"


def _num(x: Any) -> str:
    """A number as Hydra reads it back to the same value (1e-06 for 1e-6, 0.28 for 0.28, 5 for 5.0)."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _merge(base: Sequence[tuple[str, str]], later: Sequence[tuple[str, str]]) -> list[str]:
    """`key=value` strings, a later key replacing an earlier one in place (one entry per key, as Hydra needs)."""
    out: dict[str, str] = {}
    for key, value in [*base, *later]:
        out[key] = value
    return [f"{k}={v}" for k, v in out.items()]


# --- config ---------------------------------------------------------------------------------------------------
def check(cfg: Mapping[str, Any], source: str = "config/eapo.yaml") -> None:
    """What the recipes need from the config, by key: the recipe block with commits, a checkpoint at the last step
    (LUFFY's fork saves only every save_freq steps), an overlong buffer shorter than the response length (the DAPO
    reward manager asserts it), and whole train batches of mini batches."""
    if not any(m in RECIPE_METHODS for m in cfg["methods"]):
        return
    rec = cfg["math"].get("recipes")
    if rec is None:
        raise ConfigError(f"{source}: methods {RECIPE_METHODS} need the math.recipes block (commits, GPUs)")
    for key in ("verl_recipe", "luffy"):
        commit = rec["repos"][key]["commit"]
        if not re.fullmatch(r"[0-9a-f]{40}", str(commit)):
            raise ConfigError(f"{source}: math.recipes.repos.{key}.commit = {commit!r} is not a 40-hex commit")
    if rec["validation"] not in cfg["math"]["datasets"]:
        raise ConfigError(f"{source}: math.recipes.validation {rec['validation']!r} is not in math.datasets")
    steps, prompts = int(cfg["rl"]["steps"]), int(cfg["rl"]["prompts_per_step"])
    limit = cfg["resources"].get("train_runtime_min")
    for m in RECIPE_METHODS:
        r = rec[m]
        if steps % int(r["save_freq"]):
            raise ConfigError(f"{source}: math.recipes.{m}.save_freq {r['save_freq']} does not divide rl.steps {steps}")
        if limit is not None and int(r["save_freq"]) * float(limit) / steps > CHECKPOINT_EVERY_MIN:
            raise ConfigError(
                f"{source}: math.recipes.{m}.save_freq {r['save_freq']}: at the pace the job's limit allows "
                f"(resources.train_runtime_min {limit} / rl.steps {steps} min a step) a checkpoint comes less often "
                f"than every {CHECKPOINT_EVERY_MIN} min; lower it"
            )
        if prompts % int(r["ppo_mini_batch_size"]):
            raise ConfigError(
                f"{source}: math.recipes.{m}.ppo_mini_batch_size {r['ppo_mini_batch_size']} does not divide "
                f"rl.prompts_per_step {prompts}"
            )
    if int(rec["dapo"]["overlong_buffer_len"]) >= int(cfg["math"]["trl"]["max_completion_length"]):
        raise ConfigError(
            f"{source}: math.recipes.dapo.overlong_buffer_len must be below math.trl.max_completion_length "
            f"({cfg['math']['trl']['max_completion_length']})"
        )


# --- data -------------------------------------------------------------------------------------------------------
def chat_messages(template: str, problem: str) -> list[dict[str, str]]:
    """Our ChatML prompt template as the messages a chat template renders back into it: its system and user turns
    with {problem} filled in, ending where the assistant's turn opens. A template that is not ChatML ending in an
    open assistant turn is refused (verl and LUFFY apply the tokenizer's chat template to messages)."""
    text = template.replace("{problem}", problem)
    turns = CHATML.findall(text)
    if not turns or turns[-1] != ("assistant", "") or "".join(_chatml(turns[:-1])) + _open() != text:
        raise ConfigError(
            "math.prompt_template: the recipes (verl, LUFFY) need a ChatML template "
            "(<|im_start|>role\\n...<|im_end|>\\n turns ending in an open assistant turn)"
        )
    return [{"role": role, "content": content} for role, content in turns[:-1]]


def _chatml(turns) -> list[str]:
    return [f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns]


def _open() -> str:
    return "<|im_start|>assistant\n"


def render_chatml(messages: Sequence[Mapping[str, str]]) -> str:
    """Qwen2.5's chat template on `messages` with add_generation_prompt (for the tests' round trip)."""
    return "".join(_chatml([(m["role"], m["content"]) for m in messages])) + _open()


def verl_rows(frame, template: str, split: str, targets: Sequence[str | None] | None = None):
    """The parquet rows verl's RLHFDataset (and, with `targets`, LUFFY's RLHFDatasetWithTarget) read, one per
    problem of `frame` (our preprocessed rows: problem_id, problem, answer)."""
    import pandas as pd

    rows = []
    for i, (pid, problem, answer) in enumerate(zip(frame["problem_id"], frame["problem"], frame["answer"])):
        row = {
            "data_source": DATA_SOURCE,
            "prompt": chat_messages(template, str(problem)),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(answer)},
            "extra_info": {"split": split, "index": i, "problem_id": int(pid)},
        }
        if targets is not None:
            row["target"] = None if targets[i] is None else [{"role": "assistant", "content": targets[i]}]
        rows.append(row)
    return pd.DataFrame(rows)


def luffy_rows(frame, traces, template: str, split: str):
    """LUFFY's training rows: each problem with its pi_E trace (`traces`: problem_id, trace, correct; the first
    correct trace per problem); problems without a correct trace are dropped, as LUFFY's data hold verified traces
    only. Returns (rows, dropped)."""
    ok = traces[traces["correct"].astype(bool)].drop_duplicates("problem_id", keep="first").set_index("problem_id")
    keep = frame[frame["problem_id"].isin(ok.index)].reset_index(drop=True)
    targets = [str(ok.loc[pid, "trace"]) for pid in keep["problem_id"]]
    return verl_rows(keep, template, split, targets), int(len(frame) - len(keep))


# --- command lines ------------------------------------------------------------------------------------------------
def dapo_overrides(cfg: Mapping[str, Any], paths: Mapping[str, str], seed: int, resume: bool = False) -> list[str]:
    """The DAPO recipe's overrides with ours: `paths` names model, train, validation, checkpoints, name. `resume`:
    verl's own resume switch (`trainer.resume_mode=auto`: the newest global_step_* under the checkpoint folder, a
    fresh start when there is none) and the last `KEEP_CHECKPOINTS` checkpoints kept (save_freq saves many)."""
    rl, math, r = cfg["rl"], cfg["math"], cfg["math"]["recipes"]["dapo"]
    prompt_len, resp_len = int(math["max_prompt_length"]), int(math["trl"]["max_completion_length"])
    gpus = int(cfg["resources"].get("train_gpus", cfg["resources"]["gpus"]))
    ours = [
        ("data.train_files", paths["train"]),
        ("data.val_files", paths["validation"]),
        ("data.max_prompt_length", str(prompt_len)),
        ("data.max_response_length", str(resp_len)),
        ("data.gen_batch_size", str(int(rl["prompts_per_step"]) * int(r["gen_batch_factor"]))),
        ("data.train_batch_size", str(int(rl["prompts_per_step"]))),
        ("data.seed", str(int(seed))),
        ("actor_rollout_ref.rollout.n", str(int(rl["group_size"]))),
        ("actor_rollout_ref.actor.clip_ratio_low", _num(rl["eps_low"])),
        ("actor_rollout_ref.actor.clip_ratio_high", _num(rl["eps_high"])),
        ("algorithm.filter_groups.max_num_gen_batches", str(int(r["max_num_gen_batches"]))),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", str(prompt_len + resp_len)),
        ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", str(prompt_len + resp_len)),
        ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", str(prompt_len + resp_len)),
        ("actor_rollout_ref.model.path", paths["model"]),
        ("actor_rollout_ref.actor.optim.lr", _num(rl["lr"])),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", str(int(r["ppo_mini_batch_size"]))),
        ("actor_rollout_ref.actor.grad_clip", _num(rl["grad_clip"])),
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", str(int(r["sp_size"]))),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", _num(r["gpu_memory_utilization"])),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", str(int(r["rollout_tp"]))),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", str(prompt_len + resp_len)),
        ("actor_rollout_ref.rollout.temperature", _num(rl["temperature"])),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", _num(rl["temperature"])),
        ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", str(int(r["sp_size"]))),
        ("reward.reward_kwargs.overlong_buffer_cfg.len", str(int(r["overlong_buffer_len"]))),
        ("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor", _num(r["overlong_penalty_factor"])),
        ("reward.reward_kwargs.max_resp_len", str(resp_len)),
        ("reward.custom_reward_function.path", paths["reward"]),
        ("reward.custom_reward_function.name", "compute_score"),
        ("trainer.logger", "['console']"),
        ("trainer.project_name", "paperflow-eapo"),
        ("trainer.experiment_name", paths["name"]),
        ("trainer.n_gpus_per_node", str(gpus)),
        ("trainer.val_before_train", str(bool(r["val_before_train"]))),
        ("trainer.test_freq", str(int(r["test_freq"]))),
        ("trainer.save_freq", str(int(r["save_freq"]))),
        ("trainer.total_epochs", str(int(r["total_epochs"]))),
        ("trainer.total_training_steps", str(int(rl["steps"]))),
        ("trainer.default_local_dir", paths["checkpoints"]),
        ("trainer.resume_mode", "auto" if resume else "disable"),
    ]
    if resume:
        ours.append(("trainer.max_actor_ckpt_to_keep", str(KEEP_CHECKPOINTS)))
    return _merge(DAPO_FIXED, ours)


def luffy_overrides(cfg: Mapping[str, Any], paths: Mapping[str, str], resume: bool = False) -> list[str]:
    """LUFFY's train.sh overrides with ours (`paths` as dapo_overrides'); the off-policy trace is cut at the
    response length (max_prefix_len), as train.sh sets both to 8192. `resume`: the fork's resume switch named
    (`trainer.resume_mode=auto`, also its mix_ppo_trainer.yaml default at 01f4ae06: its RayPPOTrainer._load_checkpoint
    finds the newest checkpoint by latest_checkpointed_iteration.txt and restores the actor, the pickled dataloader
    and its sampler state); train.sh's `trainer.max_optim_to_keep=2` already strips older checkpoints' weights."""
    rl, math, r = cfg["rl"], cfg["math"], cfg["math"]["recipes"]["luffy"]
    resp_len = int(math["trl"]["max_completion_length"])
    gpus = int(cfg["resources"].get("train_gpus", cfg["resources"]["gpus"]))
    ours = [
        ("data.train_files", paths["train"]),
        ("data.val_files", paths["validation"]),
        ("data.train_batch_size", str(int(rl["prompts_per_step"]))),
        ("data.max_prompt_length", str(int(math["max_prompt_length"]))),
        ("data.max_response_length", str(resp_len)),
        ("actor_rollout_ref.model.path", paths["model"]),
        ("actor_rollout_ref.actor.optim.lr", _num(rl["lr"])),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", str(int(r["ppo_mini_batch_size"]))),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", str(int(r["rollout_tp"]))),
        ("actor_rollout_ref.rollout.temperature", _num(rl["temperature"])),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", _num(r["gpu_memory_utilization"])),
        ("actor_rollout_ref.rollout.n", str(int(rl["group_size"]))),
        ("actor_rollout_ref.rollout.max_prefix_len", str(resp_len)),
        ("trainer.logger", "['console']"),
        ("trainer.project_name", "paperflow-eapo"),
        ("trainer.experiment_name", paths["name"]),
        ("trainer.n_gpus_per_node", str(gpus)),
        ("trainer.save_freq", str(int(r["save_freq"]))),
        ("trainer.test_freq", str(int(r["test_freq"]))),
        ("data.reward_impl_version", LUFFY_REWARD_IMPL_VERSION),
        ("trainer.default_local_dir", paths["checkpoints"]),
        ("trainer.total_epochs", str(int(r["total_epochs"]))),
        ("trainer.total_training_steps", str(int(rl["steps"]))),
    ]
    if resume:
        ours.append(("trainer.resume_mode", "auto"))
    return _merge(LUFFY_FIXED, ours)


def command(module: str, overrides: Sequence[str], python: str = "python3") -> list[str]:
    return [python, "-m", module, *overrides]


def merge_command(actor_dir: str | Path, target: str | Path, python: str = "python3") -> list[str]:
    """verl's model merger on one FSDP actor checkpoint (its `huggingface/` config beside the shards)."""
    return [
        python,
        "-m",
        MERGER_MODULE,
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor_dir),
        "--target_dir",
        str(target),
    ]


# --- checkpoints ------------------------------------------------------------------------------------------------
def final_actor(checkpoints: str | Path, steps: int) -> Path:
    """`<checkpoints>/global_step_<steps>/actor`, the run's last step as its tracker file names it; a run whose
    tracker names another step (stopped early, or no checkpoint at the last step) is refused."""
    checkpoints = Path(checkpoints)
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    if not tracker.is_file():
        raise FileNotFoundError(f"{tracker}: no checkpoint was saved")
    latest = int(tracker.read_text().strip())
    if latest != int(steps):
        raise RuntimeError(f"{tracker}: the last checkpoint is step {latest}, not the run's final step {steps}")
    actor = checkpoints / f"global_step_{latest}" / "actor"
    if not sorted(actor.glob("model_world_size_*_rank_*.pt")):
        raise FileNotFoundError(f"{actor}: no model_world_size_*_rank_*.pt shards")
    return actor


def merge_fsdp_shards(actor_dir: str | Path, target: str | Path, dtype: str = "bfloat16") -> Path:
    """LUFFY's fork has no model merger: its FSDP checkpoint (`model_world_size_<W>_rank_<r>.pt`, each rank's
    sharded state dict, and `huggingface/` with the config and tokenizer) as a Hugging Face folder. Each
    parameter is the concatenation along dim 0 of the ranks' local tensors in rank order (FSDP's Shard(0), as
    verl's merger does for a 1-D mesh); the model is built from the config and saved with save_pretrained."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    actor_dir, target = Path(actor_dir), Path(target)
    shards = sorted(actor_dir.glob("model_world_size_*_rank_*.pt"))
    if not shards:
        raise FileNotFoundError(f"{actor_dir}: no model_world_size_*_rank_*.pt shards")
    world = int(re.match(r"model_world_size_(\d+)_rank_", shards[0].name).group(1))
    paths = [actor_dir / f"model_world_size_{world}_rank_{r}.pt" for r in range(world)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{actor_dir}: missing shards {missing}")
    states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]

    def local(t):
        return (
            t._local_tensor if hasattr(t, "_local_tensor") else (t.local_tensor() if hasattr(t, "local_tensor") else t)
        )

    merged = {k: torch.cat([local(s[k]) for s in states], dim=0) for k in states[0]}
    hf = actor_dir / "huggingface"
    config = AutoConfig.from_pretrained(hf, local_files_only=True)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    expected = dict(model.state_dict())
    tied = getattr(config, "tie_word_embeddings", False)
    for key, param in expected.items():
        if key not in merged and not (tied and key == "lm_head.weight"):
            raise KeyError(f"{actor_dir}: parameter {key} is in no shard")
        if key in merged and tuple(merged[key].shape) != tuple(param.shape):
            raise ValueError(f"{actor_dir}: {key} merged to {tuple(merged[key].shape)}, expected {tuple(param.shape)}")
    extra = sorted(set(merged) - set(expected))
    if extra:
        raise KeyError(f"{actor_dir}: shards hold parameters the config's model lacks: {extra[:5]}")
    model.load_state_dict({k: v.to(getattr(torch, dtype)) for k, v in merged.items()}, strict=False)
    if tied:
        model.tie_weights()
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(hf, local_files_only=True).save_pretrained(target)
    return target


def write_fsdp_shards(model, actor_dir: str | Path, world_size: int) -> None:
    """A fake FSDP checkpoint of `model` in verl's layout (each rank's Shard(0) slice of every tensor, the config
    in huggingface/): what the tests merge back."""
    import torch

    actor_dir = Path(actor_dir)
    actor_dir.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    for r in range(world_size):
        torch.save(
            {k: v.chunk(world_size, dim=0)[r].clone() for k, v in state.items()},
            actor_dir / f"model_world_size_{world_size}_rank_{r}.pt",
        )
    model.config.save_pretrained(actor_dir / "huggingface")


# --- source trees -------------------------------------------------------------------------------------------------
def assemble_dapo(recipe_repo: Path, out: Path) -> Path:
    """verl's layout for the recipe (verl's `recipe/` is the verl-recipe submodule): `<out>/recipe/dapo` from the
    verl-recipe checkout; verl itself is the installed PyPI package (envs/lm-verl.yaml)."""
    src = recipe_repo / "dapo"
    if not (src / "main_dapo.py").is_file():
        raise RuntimeError(f"{recipe_repo}: no dapo/main_dapo.py: not verl-recipe?")
    if out.exists():
        shutil.rmtree(out)
    (out / "recipe").mkdir(parents=True)
    (out / "recipe" / "__init__.py").write_text("")
    shutil.copytree(src, out / "recipe" / "dapo", ignore=shutil.ignore_patterns(".git"))
    return out


def luffy_pythonpath(luffy_repo: Path) -> list[str]:
    """LUFFY's install (`pip install -e .` in luffy/ and luffy/verl): its verl fork and its deepscaler package."""
    paths = [luffy_repo / "luffy" / "verl", luffy_repo / "luffy"]
    if not (paths[0] / "verl" / "mix_src" / "main_mix_ppo.py").is_file():
        raise RuntimeError(f"{luffy_repo}: no luffy/verl/verl/mix_src/main_mix_ppo.py: not LUFFY?")
    return [str(p) for p in paths]


def run_logged(cmd: Sequence[str], log_path: str | Path, cwd: str | Path | None = None, env=None) -> None:
    """`cmd` with its output in `log_path`; a failure names the command's exit code and the log."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as out:
        proc = subprocess.run(list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"{cmd[0]} {' '.join(cmd[1:3])} ... failed ({proc.returncode}); see {log_path}")


def write_pointer(out: str | Path, folder: str | Path, **extra: Any) -> dict[str, Any]:
    doc = {"folder": str(folder), **extra}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


# --- the rules' jobs --------------------------------------------------------------------------------------------
def download(repos: Mapping[str, Any], cache: str, out: str) -> dict[str, Any]:
    """verl-recipe and LUFFY at their pinned commits (math.recipes.repos), DAPO's tree assembled as verl lays it
    out; `out` names the commits and folders."""
    from paperflow.core.download import git_checkout as checkout

    base = Path(cache) / "recipes"
    doc: dict[str, Any] = {}
    for key in ("verl_recipe", "luffy"):
        ref = repos[key]
        folder = checkout(ref["git"], ref["commit"], base / key / ref["commit"], f"math.recipes.repos.{key}.commit")
        doc[key] = {"git": ref["git"], "commit": ref["commit"], "folder": str(folder)}
    doc["dapo_tree"] = str(assemble_dapo(Path(doc["verl_recipe"]["folder"]), base / "dapo_tree"))
    luffy_pythonpath(Path(doc["luffy"]["folder"]))  # refuses a tree without LUFFY's trainer
    write_pointer(out, doc["dapo_tree"], **doc)
    return doc


def latest_step(checkpoints: str | Path) -> int:
    """The step of the newest complete checkpoint under `checkpoints` (verl's and LUFFY's tracker,
    latest_checkpointed_iteration.txt, written after the step's files); 0 when there is none."""
    tracker = Path(checkpoints) / "latest_checkpointed_iteration.txt"
    return int(tracker.read_text().strip()) if tracker.is_file() else 0


def train(
    method: str,
    seed: int,
    cfg: Mapping[str, Any],
    inputs: Mapping[str, str],
    out: str,
    python: str = "python3",
    checkpoints: str | Path | None = None,
) -> dict[str, Any]:
    """One run of DAPO's or LUFFY's recipe on this node's GPUs, then its last checkpoint as a Hugging Face folder
    beside `out` (`<out without .json>/`), named by `out` as the evaluate rule reads it.

    `checkpoints` None: the checkpoint folder beside `out` is emptied first (resume_mode disable: a rerun never
    continues a stale run). `checkpoints` (the job's checkpoint folder, job.checkpoint_dir(), keyed by the job's
    params, code and inputs): the trainer saves there every `save_freq` steps and resumes from its newest
    checkpoint (`trainer.resume_mode=auto`); a rerun whose tracker already names the final step skips the trainer
    (verl would train one step past it) and only merges."""
    import os

    if method not in RECIPE_METHODS:
        raise ConfigError(f"method {method!r} is not a recipe method; allowed: {RECIPE_METHODS}")
    run_dir = Path(out).with_suffix("")
    steps = int(cfg["rl"]["steps"])
    if checkpoints is None:
        ckpt = run_dir.with_name(run_dir.name + "_checkpoints")
        if ckpt.exists():
            shutil.rmtree(ckpt)
        resumed = 0
    else:
        ckpt = Path(checkpoints)
        ckpt.mkdir(parents=True, exist_ok=True)
        resumed = latest_step(ckpt)
    resume = checkpoints is not None
    src = json.loads(Path(inputs["recipes"]).read_text())
    base_model = json.loads(Path(inputs["start"]).read_text())["folder"]
    paths = {
        "model": base_model,
        "validation": str(Path(inputs["validation"]).resolve()),
        "checkpoints": str(ckpt.resolve()),
        "name": f"eapo-{method}-seed{seed}",
        "reward": str(REWARD_FILE),
        "train": str(Path(inputs["train"]).resolve()),
    }
    env = dict(os.environ)
    if method == "dapo":  # a working copy per job: verl's configs are copied in, Hydra writes outputs/ there
        work = run_dir.with_name(run_dir.name + "_work")
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(Path(src["dapo_tree"]) / "recipe", work / "recipe")
        cwd, extra_path = str(work.resolve()), [str(work.resolve())]
        link_verl_config(Path(cwd))
        cmd = command(DAPO_MODULE, dapo_overrides(cfg, paths, seed, resume=resume), python)
    else:
        python = luffy_python(cfg)
        extra_path = luffy_pythonpath(Path(src["luffy"]["folder"]))
        cwd = extra_path[0]
        env.update(LUFFY_ENV)
        cmd = command(LUFFY_MODULE, luffy_overrides(cfg, paths, resume=resume), python)
    modules = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([*extra_path, modules, *filter(None, [env.get("PYTHONPATH")])])
    log_dir = run_dir.with_name(run_dir.name + "_logs")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    doc = {"cwd": cwd, "argv": cmd, **({"resumed_from_step": resumed} if resume else {})}
    Path(str(out) + ".command.json").write_text(json.dumps(doc, indent=1) + "\n")
    if resumed < steps:  # each attempt its own log: a resumed run keeps the cut one's
        run_logged(cmd, log_dir / (f"train_from_step{resumed}.log" if resumed else "train.log"), cwd=cwd, env=env)
    actor = final_actor(ckpt, steps)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    if method == "dapo":
        run_logged(merge_command(actor, run_dir, python), log_dir / "merge.log", env=env)
    else:  # in LUFFY's own interpreter: its torch wrote the shards
        merge = [python, "-m", "paperflow.eapo.recipes", "merge", str(actor), str(run_dir), cfg["pretrained"]["dtype"]]
        run_logged(merge, log_dir / "merge.log", env=env)
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir}: the merged model has no config.json")
    extra = {"resumed_from_step": resumed} if resume else {}  # resume: `checkpoint` goes with the job's folder
    return write_pointer(out, run_dir, method=method, seed=int(seed), checkpoint=str(actor), **extra)


def luffy_python(cfg: Mapping[str, Any]) -> str:
    """LUFFY's interpreter: its stack (torch 2.4, vLLM 0.6.3, transformers 4.46) cannot share an env with verl 0.9.1;
    the job runs in envs/lm-verl-luffy.yaml, so by default (`math.recipes.luffy.python` null) this process's own
    python, or the interpreter that key names (a LUFFY env built by hand)."""
    python = cfg["math"]["recipes"]["luffy"].get("python")
    return str(python) if python else sys.executable


def link_verl_config(tree: Path) -> Path:
    """dapo/config/dapo_trainer.yaml finds verl's configs through `hydra.searchpath: file://verl/trainer/config`,
    relative to the working directory (the recipe runs from a verl clone): the installed verl's config folder is
    copied there (data files only; the installed package still wins the import, a regular package over a folder)."""
    import importlib.util

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("verl is not importable in this job's env (envs/lm-verl.yaml pins verl 0.9.1)")
    src = Path(list(spec.submodule_search_locations)[0]) / "trainer" / "config"
    dest = tree / "verl" / "trainer" / "config"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return dest


if __name__ == "__main__":  # python -m paperflow.eapo.recipes merge ACTOR_DIR TARGET DTYPE (LUFFY's env)
    import sys

    if len(sys.argv) != 5 or sys.argv[1] != "merge":
        raise SystemExit("usage: python -m paperflow.eapo.recipes merge ACTOR_DIR TARGET DTYPE")
    merge_fsdp_shards(sys.argv[2], sys.argv[3], sys.argv[4])
