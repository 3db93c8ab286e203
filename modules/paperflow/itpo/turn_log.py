"""Paper scale's per-turn log: a hook in the official recipe's trainer (Graph-COM/ITPO `recipe/itpo/
prime_ray_trainer.py`) that writes, at every training step, each episode's turn scores and its outcome, so the
turn-credit claim is measured at paper scale too (`paper_report.turn_aurocs` reads the file).

The recipe computes its turn rewards inside `RayPRIMETrainer.fit()` and hands the batch to the module's
`compute_advantage` once per step; the batch then holds the PRM's token scores before its update on the batch
(`before_update_rm_scores`) and after it (`rm_scores`), the multi-turn `response_mask` (an assistant turn is a run
of 1s), the outcome the recipe credits (`scores`) and each episode's prompt group (`uid`). `setup()` wraps that
function: the launch names it as Ray's `worker_process_setup_hook` and the log path in the runtime env
(`recipe.turn_log_overrides`), so it runs in the Ray task that runs the trainer. The turn score is
S_k / n_k, the recipe's `segment_means` (`calculate_segment_proportions_itponorm`), computed by
`paperflow.itpo.rewards.turn_stats`, the code that scores turns at smoke and cpu scale. torch only (no verl).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch

from paperflow.itpo import rewards
from paperflow.itpo.recipe import TURN_LOG_ENV

TURN_LOG_START_ENV = "PAPERFLOW_ITPO_TURN_LOG_START"  # the step a resumed run continues after (paper.train)

log = logging.getLogger(__name__)

TRAINER_MODULE = "recipe.itpo.prime_ray_trainer"
BATCH_KEYS = ("before_update_rm_scores", "rm_scores", "response_mask", "scores")


def per_turn(scores: torch.Tensor, response_mask: torch.Tensor) -> list[list[float]]:
    """Per episode, S_k / n_k of each of its turns (the turns being the runs of 1s of `response_mask`)."""
    t = rewards.turn_stats(scores.float(), response_mask)
    means = (t.sums / t.counts.clamp(min=1)).tolist()
    return [row[:k] for row, k in zip(means, t.valid.sum(1).tolist())]


def episode_rows(step: int, data: Any) -> list[dict[str, Any]]:
    """One record per episode of a recipe batch (`data.batch` tensors, `data.non_tensor_batch['uid']`): the step,
    the episode's row and prompt group, its outcome, and per turn its length n_k and its score S_k / n_k under the
    PRM before (`score`) and after (`score_after`) the PRM's update on this batch. [] when the batch has no PRM
    scores (outcome-only RLOO: reward_dpo_coef 0, no PRM)."""
    batch = data.batch
    if "before_update_rm_scores" not in batch.keys():
        return []
    missing = [k for k in BATCH_KEYS if k not in batch.keys()]
    if missing:
        raise KeyError(f"the recipe's batch lacks {missing}: not the ITPO trainer's batch at compute_advantage?")
    mask = batch["response_mask"]
    before = per_turn(batch["before_update_rm_scores"], mask)
    after = per_turn(batch["rm_scores"], mask)
    counts = rewards.turn_stats(batch["rm_scores"].float(), mask).counts.tolist()
    outcome = batch["scores"].float().tolist()
    uid = data.non_tensor_batch["uid"]
    return [
        {
            "step": int(step),
            "episode": i,
            "uid": str(uid[i]),
            "outcome": float(outcome[i]),
            "tokens": [int(c) for c in counts[i][: len(before[i])]],
            "score": before[i],
            "score_after": after[i],
        }
        for i in range(len(outcome))
    ]


def keep_until(path: str | Path, step: int) -> None:
    """Keep the records of steps up to `step` in the log at `path` (a resumed run logs the later ones again), an
    empty log when `step` is 0."""
    path = Path(path)
    kept = []
    if step and path.exists():
        kept = [
            line
            for line in path.read_text().splitlines(keepends=True)
            if line.endswith("\n") and json.loads(line)["step"] <= step
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(kept))


def append(path: str | Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def install(path: str | Path, module: Any, start: int = 0) -> None:
    """Wrap `module.compute_advantage` (the recipe trainer's module) so each call first appends the batch's
    episodes to `path`; the call count after `start` (the step a resumed run continues after) is the training step.
    Idempotent."""
    original = module.compute_advantage
    if getattr(original, "turn_log_path", None) is not None:
        return
    step = {"n": int(start)}

    def compute_advantage(data, adv_estimator, config):
        step["n"] += 1
        append(path, episode_rows(step["n"], data))
        return original(data, adv_estimator, config)

    compute_advantage.turn_log_path = str(path)
    module.compute_advantage = compute_advantage


def setup() -> None:
    """Ray's worker_process_setup_hook: where the runtime env names a log path, install the log on the recipe's
    trainer module (imported here; it is importable wherever the recipe's trainer runs)."""
    path = os.environ.get(TURN_LOG_ENV)
    if not path:
        return
    import importlib

    try:
        module = importlib.import_module(TRAINER_MODULE)
    except ImportError as exc:  # a worker that cannot reach the recipe never runs its trainer
        log.warning("turn log not installed in this worker: %s", exc)
        return
    install(path, module, int(os.environ.get(TURN_LOG_START_ENV, "0")))
