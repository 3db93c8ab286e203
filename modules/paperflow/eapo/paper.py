"""eapo at paper scale (`source.kind: math`), one function per rule: the pretrained model and each math dataset at
pinned Hub commits, prompts in the model's template, pi_E and every method trained by TRL's GRPOTrainer with
EAPO's injecting sampler (`paper_train`, one process per GPU under torchrun), avg@k on the benchmarks with
math-verify rewards, and the report. The scripts only pass paths and params; the smoke scale's stages are
`prepare` and `stages`.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.core.resume import row_journal
from paperflow.eapo import math_data, recipes
from paperflow.eapo.methods import method as method_spec

log = logging.getLogger(__name__)
SLUG = "eapo"
TRL_METHODS = ("grpo", "eapo", "eapo_noIS", "eapo_randpos", "eapo_baseprior", "from_prior")
# TRL's GRPOTrainer has no dynamic sampling (DAPO) and no LUFFY loss: these two run their authors' verl recipes
RECIPE_METHODS = recipes.RECIPE_METHODS
PAPER_METHODS = (*TRL_METHODS, *RECIPE_METHODS)
ROLLOUT_BACKENDS = ("transformers", "vllm")  # math.rollout_backend


# --- config ---------------------------------------------------------------------------------------------------
def check(cfg: Mapping[str, Any], source: str = "config/eapo.yaml") -> None:
    """Paper-scale rules the schema cannot state: the methods TRL can run, the datasets named by the train set and
    the benchmarks, a template with {problem}, the entropy rule and mixture IS, and one batch of TRL rows holding
    whole groups of `rl.group_size` and `rl.prompts_per_step` prompts."""
    for m in cfg["methods"]:
        if m not in PAPER_METHODS:
            raise ConfigError(f"{source}: methods: {m!r} is not a paper-scale method; allowed: {PAPER_METHODS}")
    math = cfg["math"]
    names = set(math["datasets"])
    for name in [math["train_set"], *math["benchmarks"]]:
        if name not in names:
            raise ConfigError(f"{source}: math dataset {name!r} is not in math.datasets ({sorted(names)})")
    for name in math["benchmarks"]:
        if "k" not in math["datasets"][name]:
            raise ConfigError(f"{source}: math.datasets.{name}.k (avg@k's samples) is missing for a benchmark")
    math_data.check_template(math["prompt_template"], f"{source}: math.prompt_template")
    if cfg["eapo"]["critical_rule"] != "entropy" or cfg["eapo"]["is_mode"] != "mixture_clip":
        raise ConfigError(
            f"{source}: paper scale wires eapo.critical_rule 'entropy' and eapo.is_mode 'mixture_clip' only "
            f"(got {cfg['eapo']['critical_rule']!r}, {cfg['eapo']['is_mode']!r})"
        )
    backend = math.get("rollout_backend", "transformers")
    if backend not in ROLLOUT_BACKENDS:
        raise ConfigError(
            f"{source}: math.rollout_backend {backend!r} is not allowed; allowed values: {ROLLOUT_BACKENDS}"
        )
    if backend == "vllm" and "vllm" not in math:
        raise ConfigError(
            f"{source}: math.rollout_backend is 'vllm' but the math.vllm block (servers, GPUs) is missing"
        )
    trl_settings(cfg, processes=int(cfg["resources"].get("train_gpus", cfg["resources"]["gpus"])) or 1)
    recipes.check(cfg, source)


def train_job_gpus(cfg: Mapping[str, Any], method: str) -> int:
    """The GPUs one train job of `method` asks for: the learner's `resources.train_gpus`, plus with the vLLM
    rollout backend the policy server's `math.vllm.policy_gpus` and, for a method that injects, pi_E's
    `math.vllm.prior_gpus`."""
    res, math = cfg["resources"], cfg["math"]
    gpus = int(res.get("train_gpus", res["gpus"]))
    if math.get("rollout_backend", "transformers") == "vllm":
        v = math["vllm"]
        gpus += int(v["policy_gpus"]) + (int(v["prior_gpus"]) if method_spec(method).inject else 0)
    return gpus


def trl_settings(cfg: Mapping[str, Any], processes: int, steps: int | None = None, seed: int = 0) -> dict[str, Any]:
    """GRPOConfig's arguments: the method's settings from `rl` (G, lr, clip range, temperature, epochs, clipping),
    the memory layout from `math.trl`, DAPO's token-mean loss, no KL. One optimiser step sees
    per_device_train_batch_size x processes x gradient_accumulation_steps rows = rl.prompts_per_step groups of G."""
    rl, trl = cfg["rl"], dict(cfg["math"]["trl"])
    G = int(rl["group_size"])
    rows = int(trl["per_device_train_batch_size"]) * processes * int(trl["gradient_accumulation_steps"])
    if rows != int(rl["prompts_per_step"]) * G:
        raise ConfigError(
            f"math.trl: per_device_train_batch_size x GPUs x gradient_accumulation_steps = {rows} rows, but "
            f"rl.prompts_per_step x rl.group_size = {int(rl['prompts_per_step']) * G}"
        )
    per_process = int(trl["per_device_train_batch_size"]) * int(trl["gradient_accumulation_steps"])
    if per_process % G:
        raise ConfigError(f"math.trl: each process generates {per_process} rows, not whole groups of {G}")
    return {
        **trl,
        "num_generations": G,
        "learning_rate": float(rl["lr"]),
        "epsilon": float(rl["eps_low"]),
        "epsilon_high": float(rl["eps_high"]),
        "temperature": float(rl["temperature"]),
        "num_iterations": int(rl["ppo_epochs"]),
        "max_grad_norm": float(rl["grad_clip"]),
        "max_steps": int(steps if steps is not None else rl["steps"]),
        "loss_type": "dapo",
        "beta": 0.0,
        "scale_rewards": "group",
        "weight_decay": 0.0,
        "seed": int(seed),
    }


# --- downloads and preprocessing ------------------------------------------------------------------------------
def _write_json(doc: Mapping[str, Any], out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


def download_dataset(name: str, spec: Mapping[str, Any], cache: str, out: str) -> int:
    """Dataset `name`'s files (`files`) at the pinned commit, its (problem, answer) rows as one parquet file with
    the origin in the metadata. Returns the row count."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    key = f"math.datasets.{name}"
    hub = spec["hub"]
    revision = pinned_revision(hub, spec["revision"], slug=SLUG, key=f"{key}.revision", repo_type="dataset")
    folder = snapshot_folder(cache, "dataset", hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=list(spec["files"]), repo_type="dataset")
    frame = math_data.problems(math_data.read_snapshot(folder, spec["files"], key), spec, key)
    write_frame(out, frame, {"dataset": name, "hub": hub, "revision": revision, "files": list(spec["files"])})
    return len(frame)


def load_tokenizer(pretrained_json: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(json.loads(Path(pretrained_json).read_text())["folder"], local_files_only=True)


def preprocess(name: str, raw: str, pretrained_json: str, template: str, max_prompt_length: int, out: str) -> int:
    """The prompts of dataset `name` in the template; problems whose prompt exceeds `max_prompt_length` tokens of
    the model's tokenizer are dropped (counted in the metadata and the log), never truncated."""
    frame, meta = read_frame(raw)
    tokenizer = load_tokenizer(pretrained_json)
    prompts = [math_data.prompt(template, p) for p in frame["problem"]]
    lengths = np.array([len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts])
    keep = lengths <= int(max_prompt_length)
    out_frame = frame.assign(prompt=prompts, prompt_tokens=lengths)[keep].reset_index(drop=True)
    out_frame.insert(0, "problem_id", np.flatnonzero(keep))
    if (~keep).any():
        log.warning("%s: %d prompts longer than %d tokens dropped", name, int((~keep).sum()), max_prompt_length)
    write_frame(out, out_frame, {**meta, "max_prompt_length": int(max_prompt_length), "dropped": int((~keep).sum())})
    return len(out_frame)


# --- training: a torchrun launch of paper_train -----------------------------------------------------------------
def train_spec(
    cfg: Mapping[str, Any],
    method: str,
    seed: int,
    start: str,
    prior: str | None,
    train: str,
    out_dir: str,
    history: str,
    rollouts: str,
    processes: int,
    steps: int | None = None,
    checkpoints: str | None = None,
) -> dict[str, Any]:
    """Everything `paper_train.run` needs, JSON-serialisable (it crosses the torchrun boundary as a file).
    `checkpoints`: the job's checkpoint folder (job.checkpoint_dir()), where TRL saves and resumes from."""
    m = method_spec(method)
    uses_prior = bool(m.inject)
    if uses_prior and prior is None:
        raise ValueError(f"method {method!r} injects an experience model: give its folder")
    pretrained = cfg["pretrained"]
    return {
        "method": method,
        "seed": int(seed),
        "start": start,
        "prior": prior if uses_prior else None,
        "train": train,
        "out_dir": out_dir,
        "checkpoints": checkpoints,
        "history": history,
        "rollouts": rollouts,
        "device": pretrained["device"],
        "dtype": pretrained["dtype"],
        "trl": trl_settings(cfg, processes, steps, seed),
        "eapo": dict(cfg["eapo"]),
        "rollout": dict(cfg["math"]["rollout"]),
        "rollout_backend": cfg["math"].get("rollout_backend", "transformers"),
        "vllm": dict(cfg["math"]["vllm"]) if "vllm" in cfg["math"] else None,
    }


def launch(spec: Mapping[str, Any], spec_path: str, processes: int, python: str = sys.executable) -> list[str]:
    """Write `spec` and run `paper_train` on `processes` processes of this node (torchrun for more than one); with
    the vLLM rollout backend, inside `vllm_servers` (the servers up first, the learner on the remaining GPUs)."""
    from paperflow.core.launch import launch_command

    Path(spec_path).parent.mkdir(parents=True, exist_ok=True)
    command = [*shlex.split(launch_command(max(1, processes), python)), "-m", "paperflow.eapo.paper_train", spec_path]
    modules = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [modules, os.environ.get("PYTHONPATH")]))}
    with vllm_servers(spec, processes) as (spec, learner_gpus):
        if learner_gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = learner_gpus
        Path(spec_path).write_text(json.dumps(spec, indent=1) + "\n")
        log.info("launching %s", shlex.join(command))
        subprocess.run(command, check=True, env=env)
    return command


@contextmanager
def vllm_servers(spec: Mapping[str, Any], processes: int):
    """With the vLLM backend: the job's GPUs split (learner, policy server, pi_E server), the policy server
    started on a copy of the start model (its weights follow the learner), pi_E's server on the prior folder
    (injecting methods only), both with VLLM_SERVER_DEV_MODE=1 (the weight reload route) and their logs beside
    the run; yields the spec with the servers' URLs, names and the served policy folder, and the learner's
    CUDA_VISIBLE_DEVICES. With the transformers backend: (spec, None), nothing started."""
    if spec.get("rollout_backend", "transformers") != "vllm":
        yield dict(spec), None
        return
    from paperflow.core.lm import serve
    from paperflow.eapo import vllm_rollout

    v = dict(spec["vllm"])
    injects = spec["prior"] is not None
    split = vllm_rollout.gpu_split(
        os.environ.get("CUDA_VISIBLE_DEVICES"), processes, int(v["policy_gpus"]), int(v["prior_gpus"]) if injects else 0
    )
    out = Path(spec["out_dir"])
    folder = vllm_rollout.copy_model(spec["start"], str(out) + ".vllm_policy")
    port = int(v["port"])
    servers = [("policy", folder, port, int(v["policy_gpus"]), split["policy"])]
    if injects:
        servers.append(("prior", spec["prior"], port + 1, int(v["prior_gpus"]), split["prior"]))
    timeout = float(v.get("timeout_s", 1800))
    with ExitStack() as stack:
        for name, model, p, gpus, visible in servers:
            url = f"http://127.0.0.1:{p}/v1"
            command = vllm_rollout.server_command(model, name, p, gpus, v, spec["dtype"])
            stack.enter_context(
                serve.served(
                    command,
                    url,
                    timeout_s=timeout,
                    served_name=name,
                    log_path=str(out) + f".vllm_{name}.log",
                    env={"CUDA_VISIBLE_DEVICES": visible, "VLLM_SERVER_DEV_MODE": "1"},
                )
            )
            v[f"{name}_url"], v[f"{name}_name"] = url, name
        v["policy_folder"] = folder
        yield {**spec, "vllm": v}, split["learner"]


def model_folder(path: str) -> str:
    """A model folder from a pretrained.json (download) or a trained model's pointer JSON."""
    return json.loads(Path(path).read_text())["folder"]


# --- evaluation -------------------------------------------------------------------------------------------------
def evaluate(
    model_json: str,
    benchmarks: Mapping[str, str],
    ks: Mapping[str, int],
    evaluation: Mapping[str, Any],
    device_name: str,
    dtype: str,
    stop_tokens: Sequence[str] = (),
    journal: str | Path | None = None,
) -> pd.DataFrame:
    """avg@k of one trained model on each benchmark (spec section 8): k samples per problem at `temperature` and
    `top_p`, ending at EOS or one of `stop_tokens` (the rollouts' own), each scored by `math_reward` (math-verify on
    the last \\boxed{}); one row per (benchmark, problem). Each generate call is seeded by its place (benchmark and
    first row), and its rows go to the `journal` file (the job's checkpoint folder) as they finish, so a rerun skips
    the finished calls and samples the rest as an uninterrupted run does."""
    import torch
    from transformers import AutoModelForCausalLM

    from paperflow.core.device import pick
    from paperflow.eapo.math_reward import math_reward

    device = pick(device_name, key="pretrained.device")
    folder = model_folder(model_json)
    tokenizer = _tokenizer(folder)
    stops = math_data.stop_ids(tokenizer, stop_tokens)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype))
    model.to(device).eval()
    ids = []
    with row_journal(journal) as done:
        for name, path in benchmarks.items():
            frame, _ = read_frame(path)
            k = int(ks[name])
            per_call = max(1, int(evaluation["batch_size"]) // k)
            for lo in range(0, len(frame), per_call):
                part = frame.iloc[lo : lo + per_call]
                keys = [f"{name}:{int(pid)}" for pid in part["problem_id"]]
                ids += keys
                if all(key in done for key in keys):
                    continue
                torch.manual_seed(_call_seed(int(evaluation["seed"]), name, lo))
                texts = _generate(model, tokenizer, list(part["prompt"]), k, evaluation, device, stops)
                rows = []
                for i, (key, pid, answer) in enumerate(zip(keys, part["problem_id"], part["answer"])):
                    scores = [math_reward(t, answer) for t in texts[i * k : (i + 1) * k]]
                    rows.append(
                        {"id": key, "benchmark": name, "problem_id": int(pid), "k": k, "correct": int(sum(scores))}
                    )
                done.extend(r for r in rows if r["id"] not in done)
            log.info("%s: avg@%d over %d problems", name, k, len(frame))
        out = pd.DataFrame(done.complete(ids), columns=["id", "benchmark", "problem_id", "k", "correct"])
    out = out.drop(columns="id")
    out["avg"] = out["correct"] / out["k"]
    return out


def _call_seed(seed: int, name: str, lo: int) -> int:
    """The seed of one generate call: the run's seed and the call's place (a stable hash, not Python's salted one)."""
    import zlib

    return (int(seed) + zlib.crc32(f"{name}:{lo}".encode())) % 2**63


def _tokenizer(folder: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _generate(
    model, tokenizer, prompts: Sequence[str], k: int, evaluation: Mapping[str, Any], device, stops
) -> list[str]:
    import torch

    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=float(evaluation["temperature"]),
            top_p=float(evaluation["top_p"]),
            top_k=0,
            max_new_tokens=int(evaluation["max_new_tokens"]),
            num_return_sequences=k,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=list(stops),
        )
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


# --- LUFFY's off-policy traces (the recipe's data, paperflow.eapo.recipes.luffy_data) -------------------------
def recipe_data(train: str, validation: str, template: str, outputs: Mapping[str, str]) -> dict[str, int]:
    """verl's rows of the training set (`dapo_train`) and of the validation set (`validation`; LUFFY's copy with
    an empty target column, `luffy_validation`), from our preprocessed parquet files."""
    tr, _ = read_frame(train)
    va, _ = read_frame(validation)
    for key, frame, split, targets in (
        ("dapo_train", tr, "train", None),
        ("validation", va, "test", None),
        ("luffy_validation", va, "test", [None] * len(va)),
    ):
        Path(outputs[key]).parent.mkdir(parents=True, exist_ok=True)
        recipes.verl_rows(frame, template, split, targets).to_parquet(outputs[key], index=False)
    return {"train": len(tr), "validation": len(va)}


def luffy_data(train: str, traces: str, template: str, out: str) -> dict[str, int]:
    """LUFFY's training parquet: our problems with pi_E's first correct trace as the `target` column."""
    frame, _ = read_frame(train)
    rows, dropped = recipes.luffy_rows(frame, pd.read_parquet(traces), template, "train")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    rows.to_parquet(out, index=False)
    return {"rows": len(rows), "dropped": dropped}


def prior_traces(
    prior_json: str,
    train: str,
    samples: int,
    evaluation: Mapping[str, Any],
    device_name: str,
    dtype: str,
    stop_tokens: Sequence[str],
    out: str,
    journal: str | Path | None = None,
) -> dict[str, int]:
    """pi_E's traces for LUFFY: `samples` completions per training problem, sampled and decoded as `evaluate`
    does (math.evaluation's temperature, top_p and length, ending at EOS or the rollouts' stop tokens, special
    tokens dropped: LUFFY's reader appends no EOS either), each scored by the paper's reward; one row per
    (problem, sample). Calls are seeded and journalled as in `evaluate`, so a rerun goes on where it stopped."""
    import torch
    from transformers import AutoModelForCausalLM

    from paperflow.core.device import pick
    from paperflow.eapo.math_reward import math_reward

    device = pick(device_name, key="pretrained.device")
    folder = model_folder(prior_json)
    tokenizer = _tokenizer(folder)
    stops = math_data.stop_ids(tokenizer, stop_tokens)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=getattr(torch, dtype))
    model.to(device).eval()
    frame, _ = read_frame(train)
    per_call = max(1, int(evaluation["batch_size"]) // int(samples))
    ids = []
    with row_journal(journal) as done:
        for lo in range(0, len(frame), per_call):
            part = frame.iloc[lo : lo + per_call]
            keys = [f"{int(pid)}:{j}" for pid in part["problem_id"] for j in range(samples)]
            ids += keys
            if all(key in done for key in keys):
                continue
            torch.manual_seed(_call_seed(int(evaluation["seed"]), "traces", lo))
            texts = _generate(model, tokenizer, list(part["prompt"]), int(samples), evaluation, device, stops)
            rows = []
            for i, (pid, answer) in enumerate(zip(part["problem_id"], part["answer"])):
                for j, text in enumerate(texts[i * samples : (i + 1) * samples]):
                    rows.append(
                        {
                            "id": f"{int(pid)}:{j}",
                            "problem_id": int(pid),
                            "sample": j,
                            "trace": text,
                            "correct": math_reward(text, answer),
                        }
                    )
            done.extend(r for r in rows if r["id"] not in done)
        traces = pd.DataFrame(done.complete(ids), columns=["id", "problem_id", "sample", "trace", "correct"])
    traces = traces.drop(columns="id")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    traces.to_parquet(out, index=False)
    solved = int(traces.groupby("problem_id")["correct"].max().sum()) if len(traces) else 0
    return {"problems": len(frame), "solved": solved}


# --- report -----------------------------------------------------------------------------------------------------
def avg_at_k_table(evals: Mapping[tuple[str, int], str], benchmarks: Sequence[str]) -> pd.DataFrame:
    """avg@k per (method, seed) and benchmark, and their mean over the benchmarks (the spec's five-benchmark
    average), one row per (method, seed)."""
    rows = []
    for (method, seed), path in sorted(evals.items()):
        frame, _ = read_frame(path)
        row = {"method": method, "seed": seed}
        for b in benchmarks:
            part = frame[frame["benchmark"] == b]
            if part.empty:
                raise ValueError(f"{path}: no rows for benchmark {b!r}")
            row[b] = float(part["avg"].mean())
        row["average"] = float(np.mean([row[b] for b in benchmarks]))
        rows.append(row)
    return pd.DataFrame(rows)


def claims(table: pd.DataFrame, method: str = "eapo", baseline: str = "grpo") -> list[dict[str, Any]]:
    """The paper-scale reproduction target (spec section 5): `method`'s benchmark average above `baseline`'s, per
    seed the two share; one claim per baseline present."""
    out = []
    mine = table[table["method"] == method].set_index("seed")["average"]
    for base in [b for b in ("grpo", "dapo", "luffy", "eapo_noIS", "eapo_randpos", "from_prior") if b != method]:
        theirs = table[table["method"] == base].set_index("seed")["average"]
        seeds = sorted(set(mine.index) & set(theirs.index))
        if not seeds:
            continue
        diffs = [float(mine[s] - theirs[s]) for s in seeds]
        out.append(
            {
                "id": f"{method}_over_{base}_average",
                "statement": f"{method}'s avg@k averaged over the benchmarks exceeds {base}'s",
                "value": float(np.mean(diffs)),
                "per_seed": dict(zip(map(str, seeds), diffs)),
                "threshold": 0.0,
                "held": bool(np.mean(diffs) > 0),
                "gated": base == baseline,
                "seeds": seeds,
            }
        )
    return out


def report(table: pd.DataFrame, ks: Mapping[str, int], pretrained: Mapping[str, Any], out: str) -> dict[str, Any]:
    """report.md and the metrics document (returned) from the avg@k table."""
    found = claims(table)
    lines = [
        "# EAPO at paper scale",
        "",
        f"Model: `{pretrained['hub']}`. avg@k on each benchmark (k: "
        + ", ".join(f"{b} {k}" for b, k in ks.items())
        + "), math-verify on the last \\boxed{}, methods trained by TRL's GRPOTrainer with EAPO's sampler "
        + "(dapo and luffy: their authors' verl recipes).",
        "",
        table.to_markdown(index=False, floatfmt=".4f"),
        "",
        "| claim | value (mean over seeds) | threshold | held | gated |",
        "| --- | --- | --- | --- | --- |",
        *[f"| {c['statement']} | {c['value']:+.4f} | > {c['threshold']} | {c['held']} | {c['gated']} |" for c in found],
        "",
    ]
    Path(out).write_text("\n".join(lines))
    return {"claims": found, "avg_at_k": table.to_dict(orient="records"), "k": dict(ks)}
