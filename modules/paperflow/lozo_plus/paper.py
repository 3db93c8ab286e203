"""lozo_plus at paper scale (`source.kind: superglue`), one function per rule: the pretrained model and each task's
HF splits downloaded at pinned Hub commits, MeZO's sampling and templates, the ZO methods on the pretrained model
(fp16 weights on the GPU, perturbations formed in fp32), dev / test accuracy of each final model. The scripts only
pass paths and params; the smoke scale's stages are `prepare` and `stages`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.lozo_plus import lmtasks as lt
from paperflow.lozo_plus import superglue as sg

log = logging.getLogger(__name__)
SLUG = "lozo_plus"


def download_model(pretrained: Mapping[str, Any], cache: str, out: str) -> dict[str, str]:
    """The model's files (`pretrained.files`) at its pinned commit into the cache; `out` (JSON) names the commit and
    the folder, which every later rule loads offline."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub = pretrained["hub"]
    revision = pinned_revision(hub, pretrained["revision"], slug=SLUG, key="pretrained.revision", repo_type="model")
    folder = snapshot_folder(cache, "model", hub, revision)
    offline = pretrained.get("offline")
    if offline:  # the cpu scale: the copy an installed package ships stands in for the Hub download (no network)
        from paperflow.core.lm.models import materialise_gguf

        folder = snapshot_folder(cache, "model", f"{hub}-{offline}", revision)
        materialise_gguf(offline, folder)
    else:
        download_pretrained(hub, revision, folder, allow_patterns=list(pretrained["files"]))
    doc = {"hub": hub, "revision": revision, "folder": str(folder), "offline": offline}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def download_task(task: str, dataset: Mapping[str, Any], cache: str, outputs: Mapping[str, str]) -> dict[str, int]:
    """A task's HF train and validation parquet shards (only those) at the pinned commit, each split written as one
    parquet file with its origin in the metadata. Returns the rows per split."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub, subset = dataset["hub"], dataset["subset"]
    key = f"tasks.{task}.revision"
    revision = pinned_revision(hub, dataset["revision"], slug=SLUG, key=key, repo_type="dataset")
    folder = snapshot_folder(cache, "dataset", hub, revision)
    patterns = [sg.split_files(subset, split) for split in sg.HF_SPLITS]
    download_pretrained(hub, revision, folder, allow_patterns=patterns, repo_type="dataset")
    counts = {}
    for split in sg.HF_SPLITS:
        frame = sg.read_hub_split(folder, subset, split)
        meta = {"task": task, "hub": hub, "revision": revision, "subset": subset, "split": split}
        write_frame(outputs[split], frame, meta)
        counts[split] = len(frame)
    return counts


def generate_task(task: str, spec: Mapping[str, Any], outputs: Mapping[str, str]) -> dict[str, int]:
    """The offline task (cpu scale, `offline_task`) in place of a download: its HF-style train and validation
    splits, each one parquet file with its origin in the metadata, as `download_task` writes them."""
    from paperflow.lozo_plus.offline_task import generate

    counts = {}
    for split, frame in generate(spec).items():
        meta = {"task": task, "generator": spec["generator"], "seed": int(spec["seed"]), "split": split}
        write_frame(outputs[split], frame, meta)
        counts[split] = len(frame)
    return counts


def preprocess_task(
    task: str,
    raw: Mapping[str, str],
    pretrained_json: str,
    data: Mapping[str, Any],
    dev: int,
    max_length: int,
    outputs: Mapping[str, str],
) -> dict[str, int]:
    """MeZO's train / dev / test samples of a task, their prompts and token ids (the model's tokenizer), the label
    words' tokens in the metadata. Returns the rows per split."""
    from paperflow.core.lm.tokenizer import load_tokenizer

    frames = {split: read_frame(raw[split])[0] for split in sg.HF_SPLITS}
    sizes = {"train": int(data["train"]), "dev": int(dev), "test": int(data["test"])}
    picked = sg.mezo_sample(len(frames["train"]), len(frames["validation"]), sizes, int(data["seed"]))
    tokenizer = load_tokenizer(json.loads(Path(pretrained_json).read_text())["folder"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0  # masked out; any id serves
    if task in lt.LM_TASKS:
        return _preprocess_lm(task, frames, picked, tokenizer, pad_id, data, max_length, outputs)
    n_classes = len(sg.TEMPLATES[task].words)
    counts = {}
    for split, rows in picked.items():
        part = frames["validation" if split == "test" else "train"].iloc[rows]
        labels = part["label"].astype(int).to_numpy()
        if ((labels < 0) | (labels >= n_classes)).any():
            raise ValueError(f"task {task!r} split {split}: labels outside 0..{n_classes - 1} (a hidden-label split?)")
        texts = sg.prompts(task, part)
        ids, tokens, cut = sg.encode(tokenizer, task, texts, int(max_length))
        frame = pd.DataFrame({"row": rows, "prompt": texts, "ids": ids, "label": labels})
        meta = {
            "task": task,
            "split": split,
            "seed": int(data["seed"]),
            "label_words": list(sg.TEMPLATES[task].words),
            "label_tokens": list(tokens),
            "pad_id": int(pad_id),
            "max_length": int(max_length),
            "truncated": int(cut),
        }
        write_frame(outputs[split], frame, meta)
        counts[split] = len(frame)
        if cut:
            log.warning("%s %s: %d prompts longer than %d tokens kept their last tokens", task, split, cut, max_length)
    return counts


def _preprocess_lm(task, frames, picked, tokenizer, pad_id, data, max_length, outputs) -> dict[str, int]:
    """The LM-loss tasks (COPA, ReCoRD, SQuAD, DROP): prompt and completion tokens per row (lmtasks)."""
    counts = {}
    for split, rows in picked.items():
        part = frames["validation" if split == "test" else "train"].iloc[rows]
        frame, cut = lt.encode_rows(tokenizer, task, part, int(max_length))
        frame.insert(0, "row", rows)
        meta = {
            "task": task,
            "split": split,
            "kind": lt.LM_TASKS[task].kind,
            "seed": int(data["seed"]),
            "pad_id": int(pad_id),
            "max_length": int(max_length),
            "truncated": int(cut),
        }
        write_frame(outputs[split], frame, meta)
        counts[split] = len(frame)
        if cut:
            log.warning("%s %s: %d prompts cut to fit %d tokens", task, split, cut, max_length)
    return counts


def _split(path: str, device):
    """(train split, scorer) of a preprocessed file: label words (classification) or completions (LM tasks)."""
    from paperflow.lozo_plus.pretrained import LabelWordScorer, prompt_split

    frame, meta = read_frame(path)
    if "kind" in meta:
        return lt.completion_split(frame["ids"], frame["target"], meta["pad_id"], device), lt.CompletionScorer()
    return prompt_split(frame["ids"], frame["label"], meta["pad_id"], device), LabelWordScorer(meta["label_tokens"])


def _model(pretrained_json: str, pretrained: Mapping[str, Any], device):
    from paperflow.core.lm.models import load_pretrained

    info = json.loads(Path(pretrained_json).read_text())
    model = load_pretrained(info["hub"], info["revision"], info["folder"], dtype=pretrained["dtype"], device=device)
    return model.eval()


def _load(pretrained_json: str, cfg: Mapping[str, Any], stage: str, dtype: str | None = None):
    """The job's model: on `pretrained.device` for a one-GPU job; sharded over the job's `gpus` (cfg, resolved per
    (model, method) by the workflow) with accelerate's device_map "auto" and `pretrained.max_memory_gib` per GPU for
    more. `dtype` overrides `pretrained.dtype` (the first-order reference trains in `ft.dtype`)."""
    from paperflow.core.device import pick
    from paperflow.core.lm.sharding import max_memory
    from paperflow.lozo_plus.sharding import load_sharded

    pretrained = dict(cfg["pretrained"], dtype=dtype or cfg["pretrained"]["dtype"])
    gpus = int(cfg.get("gpus", 1))
    if gpus <= 1:
        return _model(pretrained_json, pretrained, pick(pretrained["device"], key="pretrained.device"))
    memory = max_memory(gpus, pretrained.get("max_memory_gib"), f"{stage} gpus", device=pretrained["device"])
    return load_sharded(json.loads(Path(pretrained_json).read_text()), pretrained["dtype"], memory).eval()


def _first_device(model):
    return model.get_input_embeddings().weight.device


def finetune_fo(
    model,
    ft: Mapping[str, Any],
    split,
    scorer,
    seed: int,
    run: Mapping[str, Any],
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float | None = None,
):
    """The first-order reference on the pretrained model (MeZO's FT): AdamW for `ft.steps` steps of `ft.batch_size`
    (default `run.batch_size`) rows on the scorer's loss, one counted forward each (plus its backward). Returns (curve rows, per-step rows).
    `checkpoint_dir`: resume from and save into it (LoopCheckpoint: weights, AdamW's state, the batch generator, the
    forward counts, the curve and step rows, the global generators (dropout's); at most every `checkpoint_every_s`
    seconds, default 30 min); None: no checkpoint."""
    import torch

    from paperflow.core.loop import LoopCheckpoint, run_loop
    from paperflow.core.resume import EVERY_S
    from paperflow.lozo_plus.training import Budgeted

    batch = int(ft.get("batch_size", run["batch_size"]))
    stream = Budgeted(model, split, seed, batch, int(run["eval_subset"]), scorer)
    opt = torch.optim.AdamW(model.parameters(), lr=float(ft["lr"]), weight_decay=float(ft["weight_decay"]))
    every = int(ft["eval_every"])

    def step(i: int):
        stream.draw()
        return scorer.loss(model, *stream.batch), {"forwards": float(stream.counter.calls)}

    def record(step: int) -> None:  # the curve's train loss without dropout
        model.eval()
        stream.record(step)
        model.train()

    def after(rec: dict[str, float]) -> None:
        if (rec["step"] + 1) % every == 0:
            record(int(rec["step"]) + 1)

    checkpoint = None
    if checkpoint_dir is not None:
        every_s = EVERY_S if checkpoint_every_s is None else checkpoint_every_s
        checkpoint = LoopCheckpoint(checkpoint_dir, {"model": model, "optimizer": opt, "stream": stream}, every_s)
    if checkpoint is None or not checkpoint.path.exists():
        record(0)
    else:  # a resumed run's curve comes back with its checkpoint
        model.train()
    records = run_loop(step, opt, int(ft["steps"]), desc=f"ft seed {seed}", on_step=after, checkpoint=checkpoint)
    if stream.curve[-1]["forwards"] != stream.counter.calls:
        record(int(ft["steps"]))
    stream.counter.close()
    return stream.curve, records


def peak_rss_bytes() -> int:
    """The job process's peak resident memory (getrusage; Linux counts kB): the CPU runs' memory, where
    torch.cuda's peak is None. It includes loading the model, so it bounds the training's own peak from above."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def train(
    task: str,
    method: str,
    seeds: Sequence[int],
    pretrained_json: str,
    train_path: str,
    cfg: Mapping[str, Any],
    outputs: Mapping[str, str],
    checkpoint_dir: str | Path | None = None,
    checkpoint_every_s: float | None = None,
) -> dict[str, Any]:
    """`method` on the pretrained model for one seed (one run per job) at the forward budget (a ZO method) or for
    `ft.steps` AdamW steps (`ft`, the first-order reference): the final weights, the curve (train loss vs forwards),
    the per-step log, the probes (none with `run.probe_every` 0) and the run's summary with the peak GPU memory
    (torch.cuda.max_memory_allocated summed over the model's GPUs; None off CUDA). `cfg.gpus` > 1 shards the model
    over that many GPUs (device_map "auto"). `checkpoint_dir` (the job's checkpoint folder): the run saves its
    state there at most every `checkpoint_every_s` seconds (default 30 min) and a rerun resumes from it, ending as
    an uninterrupted run does (`wall_s` and the peak memory are the rerun's); None: no checkpoint."""
    from paperflow.core.lm.models import save_weights
    from paperflow.core.lm.sharding import model_devices, peak_memory_total, reset_peak_memory_all
    from paperflow.core.seeding import seed_all
    from paperflow.lozo_plus import training, zo

    if len(seeds) != 1:
        raise ValueError(f"a paper-scale train job runs one seed; got {list(seeds)} (seeds_per_job must be 1)")
    seed = int(seeds[0])
    seed_all(seed)
    dtype = cfg["ft"].get("dtype") if method == "ft" else None
    model = _load(pretrained_json, cfg, "train", dtype)
    devices = model_devices(model)
    split, scorer = _split(train_path, devices[0])
    reset_peak_memory_all(devices)
    start = time.time()
    if method == "ft":
        curve, steps = finetune_fo(
            model, cfg["ft"], split, scorer, seed, cfg["run"], checkpoint_dir, checkpoint_every_s
        )
        align = []
        model.eval()
    else:
        every = {} if checkpoint_every_s is None else {"checkpoint_every_s": checkpoint_every_s}
        settings = zo.settings_from(cfg, method)
        curve, steps, align = training.finetune_zo(
            model, method, settings, split, seed, cfg["run"], scorer, checkpoint_dir=checkpoint_dir, **every
        )
    tag = {"task": task, "method": method, "seed": seed}
    summary = {
        **tag,
        "forwards": int(curve[-1]["forwards"]),
        "steps": len(steps),
        "train_loss": float(curve[-1]["train_loss"]),
        "peak_memory_bytes": peak_memory_total(devices),
        "peak_rss_bytes": peak_rss_bytes(),
        "device": ",".join(str(d) for d in devices),
        "gpus": int(cfg.get("gpus", 1)),
        "dtype": dtype or cfg["pretrained"]["dtype"],
        "wall_s": round(time.time() - start, 3),
    }
    save_weights(model, outputs["models"])
    pd.DataFrame([{**tag, **r} for r in curve]).to_csv(outputs["curve"], index=False)
    pd.DataFrame([{**tag, **r} for r in steps]).to_csv(outputs["log"], index=False)
    probes = sorted({k for r in align for k in r} - {"step", "forwards"})
    pd.DataFrame([{**tag, **r} for r in align], columns=[*tag, "step", "forwards", *probes]).to_csv(
        outputs["align"], index=False
    )
    pd.DataFrame([summary]).to_csv(outputs["summary"], index=False)
    log.info(
        "%s %s seed %d: train loss %.4f at %d forwards", task, method, seed, summary["train_loss"], summary["forwards"]
    )
    return summary


def evaluate(
    task: str,
    method: str,
    seeds: Sequence[int],
    pretrained_json: str,
    models: str | None,
    splits: Mapping[str, str],
    cfg: Mapping[str, Any],
) -> pd.DataFrame:
    """Dev and test scores of one run's final weights: loss and accuracy (argmax over the label words) of a
    classification task; for a multiple-choice task the teacher-forced completion loss and the accuracy of the best
    candidate; for a generative task that loss, and exact match and F1 of greedy decodes (`max_new_tokens`, MeZO: 50).
    `{split}_score` is the task's headline metric (accuracy; F1 for SQuAD and DROP), as MeZO's tables report it.
    `models` None scores the pretrained model as loaded (the accuracy before fine-tuning)."""
    from paperflow.core.lm.models import load_weights

    model = _load(pretrained_json, cfg, "evaluate")
    if models is None:  # the pretrained model itself, before any fine-tuning
        pass
    elif len({p.device for p in model.parameters()}) > 1:  # sharded: read on the CPU, copied into each shard
        from safetensors.torch import load_model

        load_model(model, models, strict=True, device="cpu")
    else:
        load_weights(model, models)
    device = _first_device(model)
    row = {"task": task, "method": method, "seed": int(seeds[0])}
    for name, path in splits.items():
        split, scorer = _split(path, device)
        frame, meta = read_frame(path)
        row[f"{name}_loss"], token_accuracy = scorer.evaluate(model, split)
        row[f"{name}_rows"] = len(split)
        kind = meta.get("kind")
        if kind is None:
            row[f"{name}_accuracy"] = row[f"{name}_score"] = token_accuracy
        elif kind == lt.CHOICE:
            row[f"{name}_accuracy"], _ = lt.choice_accuracy(model, frame, meta["pad_id"])
            row[f"{name}_score"] = row[f"{name}_accuracy"]
        else:
            from paperflow.core.lm.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(json.loads(Path(pretrained_json).read_text())["folder"])
            budget = int(cfg.get("max_new_tokens", 50))
            room = int(meta["max_length"]) - budget
            predictions = lt.greedy_generate(model, tokenizer, [list(r)[-room:] for r in frame["ids"]], budget)
            row[f"{name}_em"], row[f"{name}_f1"] = lt.generate_scores(task, predictions, list(frame["answers"]))
            row[f"{name}_score"] = row[f"{name}_f1"]
    return pd.DataFrame([row])
