"""The official ITPO recipe (Graph-COM/ITPO, a verl recipe) as paper scale runs it: the verl source tree assembled
at pinned commits, and the Hydra command lines of its training (`recipe.itpo.main_prime`) and evaluation
(`recipe.itpo.evaluate`) generated from the config, with the user-simulator / judge interaction file.

The overrides are those of `recipe/itpo/scripts/{math,medium}_rloo_{baseline,itpo,itponorm}.sh` and
`scripts/eval/eval.sh` at the pinned commit: what the scripts share is fixed here (`RECIPE_FIXED`), what varies by
task and method comes from the config (`tasks.<task>`, `verl`) and `METHODS`. Only paths, the run's name, the judge's
address and the logger differ from the scripts (README, "Paper scale").
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError

TRAIN_MODULE = "recipe.itpo.main_prime"
EVAL_MODULE = "recipe.itpo.evaluate"
INTERACTION_CLASS = "verl.interactions.collabllm_interaction.CollabLLMInteraction"
# where recipe/itpo/prime_ray_evaluator.py dumps the evaluation's generations (hard-coded there, relative to cwd)
EVAL_DUMP_DIR = Path("recipe") / "itpo" / "val_out"
# the per-turn log (paperflow.itpo.turn_log): Ray runs the hook in every worker of the run, where the runtime env
# names the log's path; main_prime merges ray_kwargs.ray_init.runtime_env into ray.init
TURN_LOG_ENV = "PAPERFLOW_ITPO_TURN_LOG"
TURN_LOG_HOOK = "paperflow.itpo.turn_log.setup"

# method -> the overrides that differ between the scripts (math_rloo_baseline.sh is `outcome`); `prime` is
# reconstructed: the ITPO repository has no PRIME script, so it takes the recipe's own PRIME defaults
# (config/prime_trainer.yaml: update before, reward_gt_coef 5, reward_dpo_coef 5) with adv_estimator rloo
METHODS: dict[str, dict[str, Any]] = {
    "outcome": {"adv_estimator": "rloo", "gt_coef": 5, "dpo": False, "update": "before", "temp": False},
    "prime": {"adv_estimator": "rloo", "gt_coef": 5, "dpo": True, "update": "before", "temp": False},
    "itpo": {"adv_estimator": "rloo_itpo", "gt_coef": 0, "dpo": True, "update": "itpo", "temp": True},
    "itponorm": {"adv_estimator": "rloo_itponorm", "gt_coef": 0, "dpo": True, "update": "itponorm", "temp": True},
}

# the overrides every training script sets to the same value (recipe/itpo/scripts/*_rloo_*.sh)
RECIPE_FIXED: tuple[tuple[str, str], ...] = (
    ("data.filter_overlong_prompts", "True"),
    ("data.filter_accuracy", "False"),
    ("data.accuracy_lower_bound", "0.2"),
    ("data.accuracy_upper_bound", "0.8"),
    ("data.oversample_factor", "1"),
    ("actor_rollout_ref.model.use_remove_padding", "True"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "1"),
    ("actor_rollout_ref.model.enable_gradient_checkpointing", "True"),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", "True"),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", "True"),
    ("actor_rollout_ref.actor.use_kl_loss", "True"),
    ("actor_rollout_ref.actor.kl_loss_type", "low_var_kl"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "1"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "1"),
    ("actor_rollout_ref.rollout.name", "vllm"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "1"),
    ("algorithm.use_kl_in_reward", "True"),
    ("algorithm.kl_penalty", "kl"),
    ("reward_model.micro_batch_size_per_gpu", "1"),
    ("reward_model.model.input_tokenizer", "null"),
    ("reward_model.ulysses_sequence_parallel_size", "1"),
    ("critic.ppo_micro_batch_size_per_gpu", "1"),
    ("critic.enable", "False"),
    ("trainer.val_before_train", "False"),
    ("trainer.nnodes", "1"),
    ("reward_model.reward_manager", "collabllm"),
    ("actor_rollout_ref.rollout.mode", "async"),
    ("actor_rollout_ref.rollout.free_cache_engine", "True"),
    ("actor_rollout_ref.rollout.multi_turn.enable", "true"),
    ("actor_rollout_ref.rollout.multi_turn.format", "hermes"),
    ("actor_rollout_ref.rollout.trace.token2text", "True"),
    ("custom_reward_function.path", "recipe/itpo/reward_function.py"),
    ("custom_reward_function.name", "conversation_level_reward_func"),
    ("trainer.resume_mode", "disable"),
    ("reward_model.enable_resource_pool", "True"),
)


def _num(x: Any) -> str:
    """A number as Hydra reads it back to the same value (1e-06 for 1e-6, 0.4 for 0.4, 5 for 5.0)."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def turn_log_overrides(path: str) -> list[tuple[str, str]]:
    """The overrides that carry the per-turn log into the recipe's Ray workers: `setup` as Ray's
    worker_process_setup_hook, the log's path in the runtime env."""
    return [
        ("+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook", TURN_LOG_HOOK),
        (f"+ray_kwargs.ray_init.runtime_env.env_vars.{TURN_LOG_ENV}", str(path)),
    ]


def method_settings(method: str) -> dict[str, Any]:
    if method not in METHODS:
        raise ConfigError(f"itpo method {method!r} is not wired at paper scale; choose from {sorted(METHODS)}")
    return METHODS[method]


def judge_model(simulator: Mapping[str, Any]) -> str:
    """The model name litellm routes to an OpenAI-compatible vLLM server (`hosted_vllm/<served name>`)."""
    return f"hosted_vllm/{simulator['served_name']}"


def interaction_config(simulator: Mapping[str, Any], base_url: str, temperature: float) -> dict[str, Any]:
    """recipe/itpo/config/itpo_interaction_collab(_eval).yaml with the simulator's address: the user simulator is
    the served model at `temperature` (1.0 in training, 0.0 in evaluation), at most `user_max_tokens` a reply."""
    return {
        "interaction": [
            {
                "name": "collabllm",
                "class_name": INTERACTION_CLASS,
                "config": {
                    "user_model": judge_model(simulator),
                    "num_retries": 3,
                    "max_tokens": int(simulator["user_max_tokens"]),
                    "temperature": float(temperature),
                    "enable_log": True,
                    "api_base": base_url,
                },
            }
        ]
    }


def _judge(task: Mapping[str, Any], simulator: Mapping[str, Any], verl: Mapping[str, Any], base_url: str):
    """The collabllm reward manager's judge and metric weights (the scripts' `+reward_model.reward_kwargs.*`)."""
    return [
        ("reward_model.reward_manager", "collabllm"),
        (f"+reward_model.reward_kwargs.metric_weights.{task['metric']}", "1"),
        ("+reward_model.reward_kwargs.metric_weights.token_amount", _num(verl["length_weight"])),
        ("+reward_model.reward_kwargs.llm_judge_kwargs.model", judge_model(simulator)),
        ("+reward_model.reward_kwargs.llm_judge_kwargs.max_tokens", str(int(simulator["judge_max_tokens"]))),
        ("+reward_model.reward_kwargs.llm_judge_kwargs.temperature", "0"),
        ("+reward_model.reward_kwargs.llm_judge_kwargs.api_base", base_url),
    ]


def train_overrides(
    task_name: str,
    task: Mapping[str, Any],
    method: str,
    verl: Mapping[str, Any],
    simulator: Mapping[str, Any],
    paths: Mapping[str, str],
) -> list[str]:
    """The `key=value` overrides of one training run: `paths` names the model folder (`model`), the train and
    validation parquet files, the interaction file, the checkpoint folder (`checkpoints`), the judge's `base_url`,
    the run's `name` and, where given, the per-turn log (`turn_log`: the hook's overrides, `turn_log_overrides`).
    The PRM and the reference start from the policy's model (spec 2.2)."""
    m = method_settings(method)
    beta = task["beta"].get(method)
    if beta is None:
        raise ConfigError(f"tasks.{task_name}.beta.{method} is not set (the script's reward_model.model.beta_train)")
    pairs: list[tuple[str, str]] = [
        ("data.train_files", f"['{paths['train']}']"),
        ("data.val_files", f"['{paths['validation']}']"),
        ("data.train_batch_size", str(int(verl["train_batch_size"]))),
        ("data.max_prompt_length", str(int(task["max_prompt_length"]))),
        ("data.max_response_length", str(int(task["max_response_length"]))),
        ("actor_rollout_ref.model.path", paths["model"]),
        ("actor_rollout_ref.actor.optim.lr", _num(task["actor_lr"])),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", str(int(verl["ppo_mini_batch_size"]))),
        ("actor_rollout_ref.actor.kl_loss_coef", _num(verl["kl_coef"])),
        ("actor_rollout_ref.rollout.n", str(int(verl["rollout_n"]))),
        ("actor_rollout_ref.rollout.val_kwargs.n", str(int(verl["val_n"]))),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", _num(verl["gpu_memory_utilization"])),
        ("algorithm.adv_estimator", m["adv_estimator"]),
        ("algorithm.kl_ctrl.kl_coef", _num(verl["kl_coef"])),
        ("algorithm.reward_gt_coef", _num(m["gt_coef"])),
        ("algorithm.reward_dpo_coef", _num(task["dpo_coef"] if m["dpo"] else 0)),
        ("+algorithm.reward_turn_coef", "0"),
        ("reward_model.model.path", paths["model"]),
        ("reward_model.model.update", m["update"]),
        ("reward_model.model.beta_train", _num(beta)),
        ("reward_model.model.optim.lr", _num(verl["prm_lr"])),
        ("reward_model.model.optim.grad_clip", _num(verl["prm_grad_clip"])),
        ("reward_model.mini_batch_size", str(int(verl["ppo_mini_batch_size"]))),
        *([("+reward_model.model.temp", _num(verl["turn_temperature"]))] if m["temp"] else []),
        ("critic.optim.lr", _num(verl["critic_lr"])),
        ("critic.model.path", paths["model"]),
        ("critic.ppo_mini_batch_size", str(int(verl["ppo_mini_batch_size"]))),
        ("trainer.logger", "['console']"),
        ("trainer.project_name", "paperflow-itpo"),
        ("trainer.experiment_name", paths["name"]),
        ("trainer.default_local_dir", paths["checkpoints"]),
        ("trainer.n_gpus_per_node", str(int(verl["n_gpus"]))),
        ("trainer.save_freq", str(int(verl["save_freq"]))),
        ("trainer.test_freq", str(int(verl["test_freq"]))),
        ("trainer.total_epochs", str(int(verl["total_epochs"]))),
        *_judge(task, simulator, verl, paths["base_url"]),
        ("actor_rollout_ref.rollout.temperature", _num(verl["rollout_temperature"])),
        ("actor_rollout_ref.rollout.multi_turn.max_user_turns", str(int(verl["max_user_turns"]))),
        ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns", str(int(verl["max_assistant_turns"]))),
        ("actor_rollout_ref.rollout.multi_turn.interaction_config_path", paths["interaction"]),
        *(turn_log_overrides(paths["turn_log"]) if paths.get("turn_log") else []),
    ]
    return _merge(RECIPE_FIXED, pairs)


def eval_overrides(
    task_name: str,
    task: Mapping[str, Any],
    method: str,
    verl: Mapping[str, Any],
    simulator: Mapping[str, Any],
    paths: Mapping[str, str],
) -> list[str]:
    """The overrides of scripts/eval/eval.sh for one trained run: the training overrides, then eval.sh's own
    (greedy rollouts `eval.n` per prompt, the simulator at temperature 0, validation before training; the
    evaluator's fit() returns after it), resuming the run's final checkpoint (`paths['resume']`, a global_step_<N> folder): eval.sh sets
    resume_mode=disable with the base model, which would evaluate the untrained policy."""
    ev = verl["eval"]
    pairs = [
        ("data.train_files", f"['{paths['validation']}']"),
        ("trainer.val_before_train", "True"),
        ("trainer.resume_mode", "resume_path"),
        ("trainer.resume_from_path", paths["resume"]),
        ("actor_rollout_ref.rollout.val_kwargs.n", str(int(ev["n"]))),
        ("actor_rollout_ref.rollout.val_kwargs.temperature", "0"),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample", "False"),
        ("actor_rollout_ref.rollout.n", "1"),
        ("actor_rollout_ref.rollout.temperature", "0.0"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization", _num(ev["gpu_memory_utilization"])),
    ]
    # the evaluation trains nothing: no per-turn log
    train = train_overrides(
        task_name, task, method, verl, simulator, {k: v for k, v in paths.items() if k != "turn_log"}
    )
    return _merge([tuple(o.split("=", 1)) for o in train], pairs)


def _merge(base: Sequence[tuple[str, str]], later: Sequence[tuple[str, str]]) -> list[str]:
    """`key=value` strings, a later key replacing an earlier one in place (one entry per key, as Hydra needs)."""
    out: dict[str, str] = {}
    for key, value in [*base, *later]:
        out[key] = value
    return [f"{k}={v}" for k, v in out.items()]


def command(module: str, overrides: Sequence[str], python: str = "python3") -> list[str]:
    return [python, "-m", module, *overrides]


def assemble_tree(itpo: Path, verl: Path, out: Path) -> list[str]:
    """The official setup (the ITPO README, 1.3): verl's tree with ITPO's `recipe/itpo` put into its `recipe/` and
    ITPO's `verl/...` files replacing verl's. Returns the overlaid files, relative to the tree."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(verl, out, ignore=shutil.ignore_patterns(".git"))
    placed = []
    for src in sorted(p for p in (itpo / "recipe" / "itpo").rglob("*") if p.is_file()):
        rel = src.relative_to(itpo)
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out / rel)
        placed.append(str(rel))
    for src in sorted(p for p in (itpo / "verl").rglob("*") if p.is_file()):
        rel = src.relative_to(itpo)
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out / rel)
        placed.append(str(rel))
    if not placed or not (out / "recipe" / "itpo" / "main_prime.py").is_file():
        raise RuntimeError(f"{itpo}: no recipe/itpo/main_prime.py: not the ITPO repository?")
    return placed


def job_workdir(tree: Path, workdir: Path) -> Path:
    """A working directory of its own for one verl job: a copy of the tree's `recipe/` (the modules run as
    `python -m recipe.itpo...`, and the evaluator writes its generations under recipe/itpo/val_out relative to the
    working directory, so concurrent jobs must not share it). `verl` is imported from the tree (PYTHONPATH)."""
    if (workdir / "recipe").exists():
        shutil.rmtree(workdir / "recipe")
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(tree / "recipe", workdir / "recipe", ignore=shutil.ignore_patterns("val_out", "__pycache__"))
    return workdir
