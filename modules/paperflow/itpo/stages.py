"""ITPO's stages with their files, one function per rule (the scripts only pass paths and params)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame, write_frame
from paperflow.core.lm.models import checkpoint_spec, load_checkpoint, save_checkpoint
from paperflow.core.seeding import seed_all
from paperflow.itpo import analysis, env, rl, sft
from paperflow.itpo.budget import MAX_LENGTH
from paperflow.itpo.checkpoints import load_models, save_models

log = logging.getLogger(__name__)


def download(source: Mapping[str, Any], task: Mapping[str, Any], eval_out: str, analysis_out: str) -> dict[str, int]:
    """Smoke/tiny: the fixed evaluation tasks (their user draws fixed: spec section 8) and the held-out analysis
    tasks, from seeded generators. Paper scale (CollabLLM / MTMedDialogue parquet) is refused until pinned."""
    if source["kind"] != "synthetic":
        raise ConfigError(
            f"itpo source.kind {source['kind']!r}: the paper-scale datasets (collabllm/collabllm-multiturn-math-hard, "
            "collabllm-multiturn-medium-large, MTMedDialogue) and Qwen2.5-3B/14B-Instruct are not pinned to a "
            "revision and checksum yet, so this version refuses to fetch them; use source.kind: synthetic"
        )
    sizes = {}
    for name, out in (("eval", eval_out), ("analysis", analysis_out)):
        n, seed = int(task[f"{name}_size"]), int(task[f"{name}_seed"])
        tasks = env.draw_tasks(n, np.random.default_rng(seed), task["goal"])
        write_frame(out, tasks.to_frame(), {"seed": seed, "goal": task["goal"]})
        sizes[name] = n
    return sizes


def read_tasks(path: str) -> env.Tasks:
    return env.Tasks.from_frame(read_frame(path)[0])


def write_vocabulary(tasks_path: str, out: str) -> list[str]:
    """The tokenizer's token list (ids in order) as JSON, after checking every task's opening encodes without
    an unknown word; the training stages refuse a tokenizer that differs from this file."""
    tasks = read_tasks(tasks_path)
    vocab = env.ids()
    for i in range(len(tasks)):
        missing = [w for w in env.opening(tasks, i) if w not in vocab]
        if missing:
            raise ValueError(f"{tasks_path}: task {i} has words outside the vocabulary: {missing}")
    words = [w for w, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    Path(out).write_text(json.dumps(words))
    return words


def _check_vocabulary(path: str) -> None:
    words = json.loads(Path(path).read_text())
    if {w: i for i, w in enumerate(words)} != env.ids():
        raise ValueError(f"{path}: the tokenizer's vocabulary differs from it; rerun preprocess")


def sft_init(vocabulary: str, eval_tasks: str, model: Mapping[str, Any], settings: Mapping[str, Any], out: str):
    """The initial policy (its checkpoint) and its SFT history."""
    _check_vocabulary(vocabulary)
    seed_all(int(settings["seed"]))
    spec = sft.model_spec(model)
    if spec["max_position_embeddings"] < MAX_LENGTH:
        raise ConfigError(f"model.max_position_embeddings must be >= {MAX_LENGTH} (the longest episode)")
    policy, rows = sft.train_init(spec, settings, read_tasks(eval_tasks))
    save_checkpoint(policy, out, spec)
    return pd.DataFrame(rows)


def train_method(
    method: str, init: str, eval_tasks: str, params: Mapping[str, Any], seeds: Sequence[int], out: str
) -> pd.DataFrame:
    """`method` for each seed from the initial policy: the policy, its PRM and the control PRM of every seed in one
    file (`checkpoints`; the PRMs of `outcome`, and the control of a method without it, stay the initial copy),
    and the curves of every seed."""
    s = rl.Settings.from_config(params)
    tasks = read_tasks(eval_tasks)
    curves, models = [], {}
    for seed in seeds:
        seed_all(seed)
        trained = rl.train(load_checkpoint(init), method, s, seed, tasks)
        models.update(
            {("policy", seed): trained.policy, ("prm", seed): trained.prm, ("control", seed): trained.control_prm}
        )
        curves.append(pd.DataFrame(trained.records).assign(method=method, seed=seed))
        log.info("%s seed %d: final greedy success %.3f", method, seed, trained.records[-1]["greedy_success"])
    save_models(models, out, checkpoint_spec(init))
    return pd.concat(curves, ignore_index=True)


def evaluate(checkpoints: Mapping[tuple[str, str], str], eval_tasks: str) -> pd.DataFrame:
    """Greedy success, assistant tokens and turns of every final policy on the fixed tasks (spec section 8)."""
    tasks = read_tasks(eval_tasks)
    rows = []
    for (method, _), path in sorted(checkpoints.items()):
        for (kind, seed), model in sorted(load_models(path).items()):
            if kind == "policy":
                rows.append({"method": method, "seed": seed, **rl.greedy_eval(model, tasks)})
    return pd.DataFrame(rows).sort_values(["method", "seed"], ignore_index=True)


def turn_analysis(
    checkpoints: Mapping[tuple[str, str], str], init: str, analysis_tasks: str, settings: Mapping[str, Any], beta
) -> pd.DataFrame:
    """Held-out episodes of a fixed policy, the SFT initial policy (one sample per seed, the same episodes for every
    method of that seed), every turn scored by each (method, seed) run's PRM, by its control PRM (trained on
    permuted outcomes) and by the untrained initial PRM (`score_init`), with the ex-ante labels: one row per turn.
    Scoring the trained policy's own episodes would let a PRM that only follows the policy's habits look like
    credit (issue 45: the final policy's frequent turns are its useful ones)."""
    tasks = read_tasks(analysis_tasks)
    ref = load_checkpoint(init)
    loaded: dict[str, dict] = {}
    for (method, _), path in sorted(checkpoints.items()):
        loaded.setdefault(method, {}).update(load_models(path))
    seeds = sorted({s for models in loaded.values() for _, s in models})
    frames = []
    for seed in seeds:
        gen = torch.Generator().manual_seed(int(settings["seed"]) + seed)
        episodes = env.rollout(ref, tasks, float(settings["rollout_temperature"]), gen)
        # the initial PRM (pi_phi = pi_ref, never trained: the outcome arm's), scored as the others are: all zeros
        untrained = analysis.turn_scores(ref, ref, episodes, float(beta))
        for method, models in loaded.items():
            if ("prm", seed) not in models:
                continue
            scores = {
                name: analysis.turn_scores(models[(name, seed)], ref, episodes, float(beta))
                for name in ("prm", "control")
            }
            scores["init"] = untrained
            frames.append(analysis.turn_frame(episodes, scores).assign(method=method, seed=seed))
    return pd.concat(frames, ignore_index=True)
