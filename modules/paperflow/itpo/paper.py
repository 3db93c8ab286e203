"""itpo at paper scale (`source.kind: collabllm`), one function per rule: the policy model (also the PRM and the
reference) and the simulator/judge model at pinned Hub commits, each task's CollabLLM parquet at its pinned commit,
the official recipe's source tree (ITPO + verl at pinned git commits), verl's RL rows, and the recipe's training
and evaluation run by verl with the simulator served by vLLM on the job's own GPUs. The scripts only pass paths and
params; the command lines come from `paperflow.itpo.recipe`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.core.config import ConfigError
from paperflow.core.hub import snapshot_folder
from paperflow.itpo import recipe, serving

log = logging.getLogger(__name__)
SLUG = "itpo"
PAPERFLOW_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the `paperflow` package


def _write_json(path: str | Path, doc: Mapping[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download_hub(ref: Mapping[str, Any], key: str, cache: str, out: str) -> dict[str, Any]:
    """The files of a Hub reference (`ref.files`, a model or a dataset) at its pinned commit into the cache; `out`
    (JSON) names the commit, the folder and each file's sha256, which every later rule reads offline. `key` is
    the reference's config key (`pretrained`, `simulator`, `tasks.<task>`), named when the pin is missing."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub, repo_type = ref["hub"], ref["repo_type"]
    revision = pinned_revision(hub, ref["revision"], slug=SLUG, key=f"{key}.revision", repo_type=repo_type)
    folder = snapshot_folder(cache, repo_type, hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=list(ref["files"]), repo_type=repo_type)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.parts)
    if not files:
        raise FileNotFoundError(f"{repo_type} {hub}@{revision}: no file matches {key}.files = {list(ref['files'])}")
    doc = {
        "hub": hub,
        "repo_type": repo_type,
        "revision": revision,
        "folder": str(folder),
        "sha256": {str(p.relative_to(folder)): _sha256(p) for p in files},
    }
    _write_json(out, doc)
    return doc


def download_recipe(source: Mapping[str, Any], cache: str, out: str) -> dict[str, Any]:
    """The recipe's source tree: verl at `recipe.verl.commit` with ITPO's files (`recipe.itpo.commit`) overlaid as
    the ITPO README says, under the cache; `out` (JSON) names the commits and the tree."""
    from paperflow.core import download

    itpo, verl = source["itpo"], source["verl"]
    base = Path(cache) / "recipe"
    itpo_dir = download.git_checkout(itpo["git"], itpo["commit"], base / "itpo" / itpo["commit"], "recipe.itpo.commit")
    verl_dir = download.git_checkout(verl["git"], verl["commit"], base / "verl" / verl["commit"], "recipe.verl.commit")
    tree = base / "tree" / f"{itpo['commit'][:12]}-{verl['commit'][:12]}"
    placed = recipe.assemble_tree(itpo_dir, verl_dir, tree)
    doc = {"tree": str(tree), "itpo": dict(itpo), "verl": dict(verl), "overlaid": placed}
    _write_json(out, doc)
    return doc


def preprocess(
    task_name: str, task: Mapping[str, Any], raw_json: str, recipe_json: str, split: Mapping[str, Any], outputs
) -> dict[str, int]:
    """verl's RL rows of a task (rl_train / rl_validation parquet, as process_dataset.py --dataset_type rl)."""
    from paperflow.itpo import collab

    raw = json.loads(Path(raw_json).read_text())
    tree = json.loads(Path(recipe_json).read_text())["tree"]
    rows = collab.hub_rows(raw["folder"])
    parts = collab.rl_splits(
        rows, collab.system_prompt(tree), task["task_desc"], float(split["validation_size"]), int(split["seed"])
    )
    counts = {}
    for name, data in parts.items():
        Path(outputs[name]).parent.mkdir(parents=True, exist_ok=True)
        data.to_parquet(outputs[name])
        counts[name] = len(data)
    log.info("%s: %d hub rows -> %s", task_name, len(rows), counts)
    return counts


def gpu_split(simulator: Mapping[str, Any], verl: Mapping[str, Any]) -> tuple[str, str]:
    """(CUDA_VISIBLE_DEVICES of the simulator server, of verl): the job's GPUs (its CUDA_VISIBLE_DEVICES, else
    0..N-1), the first `simulator.tensor_parallel` to vLLM and the next `verl.n_gpus` to the policy, PRM and
    reference (spec section 6: 2 + 2). With `verl.device: cuda` the GPUs must be visible."""
    n_sim, n_verl = int(simulator["tensor_parallel"]), int(verl["n_gpus"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d for d in visible.split(",") if d] if visible else [str(i) for i in range(n_sim + n_verl)]
    if verl["device"] == "cuda":
        import torch

        if torch.cuda.device_count() < n_sim + n_verl:
            raise ConfigError(
                f"verl.device = 'cuda' needs simulator.tensor_parallel + verl.n_gpus = {n_sim + n_verl} GPUs; "
                f"torch sees {torch.cuda.device_count()} (run the job where resources.gpus GPUs are visible)"
            )
    if len(ids) < n_sim + n_verl:
        raise ConfigError(f"CUDA_VISIBLE_DEVICES={visible!r} has fewer than {n_sim + n_verl} GPUs")
    return ",".join(ids[:n_sim]), ",".join(ids[n_sim : n_sim + n_verl])


@contextlib.contextmanager
def _simulator_served(cfg, simulator_json: str, tree: str, log_dir: Path, python: str):
    """The simulator server on its GPUs (log_dir/simulator.log) while the block runs; yields (the environment a
    verl launch runs in: its GPUs, the recipe tree first on PYTHONPATH; what runs where)."""
    sim, verl = cfg["simulator"], cfg["verl"]
    sim_gpus, verl_gpus = gpu_split(sim, verl)
    url = serving.base_url(sim["port"])
    folder = json.loads(Path(simulator_json).read_text())["folder"]
    log_dir.mkdir(parents=True, exist_ok=True)
    # the recipe tree first; then paperflow's own root, so the recipe's Ray workers import the turn-log hook
    path = os.pathsep.join([tree, PAPERFLOW_ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    server = serving.server_command(sim, folder, python=python)
    with serving.served(
        server,
        url,
        sim["served_name"],
        float(sim["ready_timeout_s"]),
        log_dir / "simulator.log",
        {"CUDA_VISIBLE_DEVICES": sim_gpus},
    ):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": verl_gpus, "PYTHONPATH": path, "VLLM_USE_V1": "1"}
        yield env, {"simulator": server, "simulator_gpus": sim_gpus, "verl_gpus": verl_gpus}


def _run_verl(cmd, workdir: Path, env: Mapping[str, str], log_path: Path) -> None:
    """`cmd` (a verl launch) in `workdir`, its output appended to `log_path`; a non-zero exit fails."""
    with open(log_path, "a") as out:
        proc = subprocess.run(list(cmd), cwd=workdir, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode:
        raise RuntimeError(f"verl exited with code {proc.returncode}; see {log_path}")


def _run_with_simulator(cfg, simulator_json: str, cmd, workdir: Path, tree: str, log_dir: Path, python: str):
    """`cmd` (a verl launch) in `workdir`, the recipe tree first on PYTHONPATH, on its GPUs, while the simulator
    server runs on the others; its output goes to log_dir/verl.log (the server's to log_dir/simulator.log)."""
    start = time.time()
    with _simulator_served(cfg, simulator_json, tree, log_dir, python) as (env, ran):
        _run_verl(cmd, workdir, env, log_dir / "verl.log")
    return {**ran, "wall_s": time.time() - start}


def _paths(run_dir: Path, data: Mapping[str, str], pretrained_json: str, cfg, name: str) -> dict[str, str]:
    return {
        "train": str(Path(data["train"]).resolve()),
        "validation": str(Path(data["validation"]).resolve()),
        "model": json.loads(Path(pretrained_json).read_text())["folder"],
        "checkpoints": str((run_dir / "checkpoints").resolve()),
        "base_url": serving.base_url(cfg["simulator"]["port"]),
        "name": name,
    }


def train(
    task_name: str,
    method: str,
    seeds,
    cfg: Mapping[str, Any],
    inputs: Mapping[str, str],
    out: str,
    python=None,
    turns: str | None = None,
    checkpoints: str | None = None,
) -> dict[str, Any]:
    """One run of the recipe's training (`recipe.itpo.main_prime`) for `method` on `task_name`: the command and
    interaction file written beside `out`, verl's checkpoints under <run>/checkpoints; `out` (JSON) names the final
    checkpoint folder (global_step_<N>, verl's latest_checkpointed_iteration.txt), the command and the GPUs.
    `turns` (JSON lines): the per-turn log the launch's hook writes (`paperflow.itpo.turn_log`), one record per
    episode and step; empty for outcome-only RLOO (no PRM), an error for a PRM method that logged nothing.

    `checkpoints` (the job's checkpoint folder, job.checkpoint_dir()): verl saves there (`trainer.save_freq`) and
    resumes from its latest checkpoint (verl's own switch, `trainer.resume_mode=auto`), the turn log kept there too,
    cut to the resumed step and numbered on from it; at the end the final global_step folder moves to
    <run>/checkpoints, where itpo_evaluate reads it, and the log is copied to `turns`."""
    from paperflow.itpo import turn_log

    if len(seeds) != 1:
        raise ValueError(f"a paper-scale train job runs one seed; got {list(seeds)} (seeds_per_job must be 1)")
    python = python or sys.executable
    run_dir = Path(out).parent
    tree = json.loads(Path(inputs["recipe"]).read_text())["tree"]
    workdir = recipe.job_workdir(Path(tree), run_dir / "work")
    name = f"{task_name}-rloo-{method}-s{seeds[0]}"
    paths = _paths(run_dir, inputs, inputs["pretrained"], cfg, name)
    if checkpoints is not None:
        paths["checkpoints"] = str(Path(checkpoints).resolve())
    resumed = latest_step(paths["checkpoints"]) if checkpoints is not None else 0
    paths["interaction"] = str((run_dir / "interaction.yaml").resolve())
    _write_yaml(paths["interaction"], recipe.interaction_config(cfg["simulator"], paths["base_url"], 1.0))
    if turns is not None:
        log_path = Path(checkpoints) / "turns.jsonl" if checkpoints is not None else Path(turns)
        paths["turn_log"] = str(log_path.resolve())
        turn_log.keep_until(log_path, resumed)  # the hook appends
    task = cfg["tasks"][task_name]
    overrides = recipe.train_overrides(task_name, task, method, cfg["verl"], cfg["simulator"], paths)
    if checkpoints is not None:
        overrides = resuming(overrides, resumed, with_turn_log=turns is not None)
    cmd = recipe.command(recipe.TRAIN_MODULE, overrides, python=python)  # the seed labels the run (verl's own seeds)
    _write_json(run_dir / "command.json", {"cwd": str(workdir), "command": cmd, "resumed_from_step": resumed})
    ran = _run_with_simulator(cfg, inputs["simulator"], cmd, workdir, tree, run_dir / "logs", python)
    step = latest_step(paths["checkpoints"])
    if not step:
        latest = Path(paths["checkpoints"]) / LATEST
        raise FileNotFoundError(f"{latest}: verl saved no checkpoint (trainer.save_freq vs the run's steps?)")
    final = Path(paths["checkpoints"]) / f"global_step_{step}"
    if checkpoints is not None:  # the job's folder goes when the job succeeds: the final step moves to the run
        kept = run_dir / "checkpoints"
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir(parents=True)
        shutil.move(str(final), kept / final.name)
        (kept / LATEST).write_text(f"{step}\n")
        final = kept / final.name
        if turns is not None:
            shutil.copyfile(paths["turn_log"], turns)
    if turns is not None and recipe.METHODS[method]["dpo"] and not Path(turns).read_text().strip():
        raise RuntimeError(f"{turns}: the turn-log hook wrote nothing for {method} (see {run_dir / 'logs'})")
    doc = {
        "task": task_name,
        "method": method,
        "seed": int(seeds[0]),
        "global_step": step,
        "checkpoint": str(final),
        "command": cmd,
        **ran,
    }
    _write_json(out, doc)
    return doc


LATEST = "latest_checkpointed_iteration.txt"  # verl's tracker of its newest complete checkpoint


def latest_step(checkpoints: str | Path) -> int:
    """The step of verl's newest complete checkpoint under `checkpoints`; 0 when there is none."""
    latest = Path(checkpoints) / LATEST
    return int(latest.read_text().strip()) if latest.is_file() else 0


def resuming(overrides: Sequence[str], step: int, with_turn_log: bool) -> list[str]:
    """The training overrides with verl's resume switch on (`trainer.resume_mode=auto`: the newest checkpoint in
    `trainer.default_local_dir`, or a fresh start when there is none) and, with the turn log, the step the hook
    numbers on from."""
    from paperflow.itpo import turn_log

    out = [o for o in overrides if not o.startswith("trainer.resume_mode=")] + ["trainer.resume_mode=auto"]
    if with_turn_log:
        out.append(f"+ray_kwargs.ray_init.runtime_env.env_vars.{turn_log.TURN_LOG_START_ENV}={int(step)}")
    return out


def eval_shards(n_rows: int, shard_prompts: int, train_batch_size: int) -> list[range]:
    """The validation rows (positions 0..n_rows-1) cut into the fewest contiguous shards of at most
    `shard_prompts`, their sizes as equal as they can be (differing by one at most). The recipe's evaluator also
    builds a train DataLoader over its data.val_files (batches of data.train_batch_size, the last partial one
    dropped) and asserts it has a batch: a shard below verl.train_batch_size rows is refused."""
    if shard_prompts < 1:
        raise ConfigError(f"evaluate.shard_prompts = {shard_prompts}: must be at least 1")
    count = max(1, -(-n_rows // shard_prompts))
    size, extra = divmod(n_rows, count)
    if size < train_batch_size:
        raise ConfigError(
            f"evaluate.shard_prompts = {shard_prompts} cuts the {n_rows} validation prompts into shards of {size}, "
            f"fewer than verl.train_batch_size = {train_batch_size} (the evaluator asserts one full train batch "
            "of its data.val_files): raise evaluate.shard_prompts to at least twice verl.train_batch_size"
        )
    bounds = [0]
    for k in range(count):
        bounds.append(bounds[-1] + size + (1 if k < extra else 0))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def shard_overrides(overrides: Sequence[str], val_file: str | Path) -> list[str]:
    """The evaluation's overrides for one shard: `data.val_files` replaced in place by the shard's file, every
    other entry as `recipe.eval_overrides` made it (one entry per key, as recipe._merge keeps them; Hydra applies
    plain overrides in order, so an appended duplicate would win as well). Only data.val_files: the evaluator reads
    its rows (RayPRIMEEvaluator._create_dataloader builds both its loaders from data.val_files) and never
    data.train_files, which stays the whole validation file eval_overrides names."""
    key = "data.val_files"
    if sum(o.split("=", 1)[0] == key for o in overrides) != 1:
        raise ValueError(f"the evaluation's overrides must set {key} once: {[o for o in overrides if key in o]}")
    pairs = [tuple(o.split("=", 1)) for o in overrides]
    return recipe._merge(pairs, [(key, f"['{Path(val_file).resolve()}']")])


SHARD_JOURNAL = "shards.jsonl"


def evaluate(
    task_name: str,
    method: str,
    cfg: Mapping[str, Any],
    inputs: Mapping[str, str],
    outputs,
    python=None,
    checkpoints: str | None = None,
) -> dict[str, Any]:
    """scripts/eval/eval.sh on a trained run's final checkpoint (greedy, the simulator at temperature 0): the
    dumped generations as a frame (`outputs['rollouts']`) and their means (`outputs['summary']`, JSON).

    The evaluator dumps its generations once, at its end, so the validation set is cut into shards
    (`eval_shards`, `evaluate.shard_prompts` prompts at most) and the evaluator runs once per shard, each run
    restarting Ray, the checkpoint and verl's vLLM (the simulator server stays up across them), with only
    data.val_files swapped (`shard_overrides`). Each finished shard's rollouts, keyed by their row's `index`
    (`collab.key_rollouts`), are appended to a journal in `checkpoints` (the job's folder, job.checkpoint_dir();
    None: a scratch folder, nothing resumes); a rerun runs only the shards not in it. The frame is the shards'
    rollouts in the validation file's row order, each row's in their rank."""
    import pyarrow.parquet as pq

    from paperflow.core.io import write_frame
    from paperflow.core.resume import row_journal
    from paperflow.itpo import collab

    python = python or sys.executable
    run = json.loads(Path(inputs["run"]).read_text())
    eval_dir = Path(outputs["summary"]).parent / f"{task_name}_{method}_s{run['seed']}"
    tree = json.loads(Path(inputs["recipe"]).read_text())["tree"]
    workdir = recipe.job_workdir(Path(tree), eval_dir / "work")
    paths = _paths(eval_dir, inputs, inputs["pretrained"], cfg, f"{run['task']}-eval-{method}-s{run['seed']}")
    paths["resume"] = run["checkpoint"]
    paths["interaction"] = str((eval_dir / "interaction.yaml").resolve())
    _write_yaml(paths["interaction"], recipe.interaction_config(cfg["simulator"], paths["base_url"], 0.0))
    task = cfg["tasks"][task_name]
    overrides = recipe.eval_overrides(task_name, task, method, cfg["verl"], cfg["simulator"], paths)
    table = pq.read_table(paths["validation"])
    rows = list(zip(table.column("index").to_pylist(), table.column("prompt").to_pylist()))
    if len({row_id for row_id, _ in rows}) != len(rows):  # the key of every rollout
        raise ValueError(
            f"{paths['validation']}: its 'index' column repeats a value (itpo_preprocess writes one a row)"
        )
    shards = eval_shards(len(rows), int(cfg["evaluate"]["shard_prompts"]), int(cfg["verl"]["train_batch_size"]))
    n = int(cfg["verl"]["eval"]["n"])
    journal_path = Path(checkpoints) / SHARD_JOURNAL if checkpoints is not None else None
    with row_journal(journal_path, key="shard") as journal:
        for kept in journal:  # a journal of another split cannot be resumed (the folder's key covers the inputs)
            k = kept["shard"]
            if k >= len(shards) or kept["ids"] != [rows[i][0] for i in shards[k]]:
                raise RuntimeError(f"{journal_path}: shard {k} holds other rows than this split's shard {k}")
        todo = journal.todo(range(len(shards)), key=lambda k: k)
        files = {k: eval_dir / "shards" / f"shard-{k:03d}.parquet" for k in todo}
        commands = {
            k: recipe.command(recipe.EVAL_MODULE, shard_overrides(overrides, files[k]), python=python) for k in todo
        }
        _write_json(
            eval_dir / "command.json",
            {
                "cwd": str(workdir),
                "command": recipe.command(recipe.EVAL_MODULE, overrides, python=python),
                "shards": [len(s) for s in shards],
                "resumed_shards": [k for k in range(len(shards)) if k not in todo],
                "shard_commands": {str(k): c for k, c in commands.items()},
            },
        )
        if todo:
            with _simulator_served(cfg, inputs["simulator"], tree, eval_dir / "logs", python) as (env, _):
                for k in todo:
                    files[k].parent.mkdir(parents=True, exist_ok=True)
                    pq.write_table(table.take(list(shards[k])), files[k])
                    shutil.rmtree(workdir / recipe.EVAL_DUMP_DIR, ignore_errors=True)  # the last shard's dump
                    _run_verl(commands[k], workdir, env, eval_dir / "logs" / f"verl_shard{k:03d}.log")
                    keyed, unscored = collab.key_rollouts(
                        collab.read_dump(workdir / recipe.EVAL_DUMP_DIR), [rows[i] for i in shards[k]], n
                    )
                    ids = [rows[i][0] for i in shards[k]]
                    journal.extend([{"shard": k, "ids": ids, "rollouts": keyed, "unscored": unscored}])
                    log.info("shard %d of %d: %d rollouts journalled", k + 1, len(shards), len(keyed))
        done = journal.complete(list(range(len(shards))))
    frame = collab.generations_frame([r for shard in done for r in shard["rollouts"]])
    unscored = [i for shard in done for i in shard["unscored"]]
    if unscored:
        log.warning("%d of %d prompts have no rollouts (verl's filter_overlong_prompts)", len(unscored), len(rows))
    summary = {
        "task": task_name,
        "method": method,
        "seed": run["seed"],
        "global_step": run["global_step"],
        **collab.summarise(frame, task["metric"]),
        "shards": len(shards),
        "unscored_prompts": len(unscored),
    }
    write_frame(outputs["rollouts"], frame.assign(task=task_name, method=method, seed=run["seed"]), summary)
    _write_json(outputs["summary"], summary)
    return summary


def _write_yaml(path: str, doc: Mapping[str, Any]) -> None:
    import yaml

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))
