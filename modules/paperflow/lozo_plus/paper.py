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
    download_pretrained(hub, revision, folder, allow_patterns=list(pretrained["files"]))
    doc = {"hub": hub, "revision": revision, "folder": str(folder)}
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


def _split(path: str, device):
    from paperflow.lozo_plus.pretrained import LabelWordScorer, prompt_split

    frame, meta = read_frame(path)
    return prompt_split(frame["ids"], frame["label"], meta["pad_id"], device), LabelWordScorer(meta["label_tokens"])


def _model(pretrained_json: str, pretrained: Mapping[str, Any], device):
    from paperflow.core.lm.models import load_pretrained

    info = json.loads(Path(pretrained_json).read_text())
    model = load_pretrained(info["hub"], info["revision"], info["folder"], dtype=pretrained["dtype"], device=device)
    return model.eval()


def train(
    task: str,
    method: str,
    seeds: Sequence[int],
    pretrained_json: str,
    train_path: str,
    cfg: Mapping[str, Any],
    outputs: Mapping[str, str],
) -> dict[str, Any]:
    """`method` on the pretrained model for one seed (one run per GPU job) at the forward budget: the final weights,
    the curve (train loss vs forwards), the per-step log, the probes (none with `run.probe_every` 0) and the run's
    summary with the peak GPU memory (None off CUDA)."""
    from paperflow.core.device import pick
    from paperflow.core.lm.models import save_weights
    from paperflow.core.seeding import seed_all
    from paperflow.lozo_plus import training, zo
    from paperflow.lozo_plus.pretrained import peak_memory, reset_peak_memory

    if len(seeds) != 1:
        raise ValueError(f"a paper-scale train job runs one seed; got {list(seeds)} (seeds_per_job must be 1)")
    seed = int(seeds[0])
    device = pick(cfg["pretrained"]["device"], key="pretrained.device")
    split, scorer = _split(train_path, device)
    seed_all(seed)
    model = _model(pretrained_json, cfg["pretrained"], device)
    reset_peak_memory(device)
    start = time.time()
    curve, steps, align = training.finetune_zo(
        model, method, zo.settings_from(cfg, method), split, seed, cfg["run"], scorer
    )
    tag = {"task": task, "method": method, "seed": seed}
    summary = {
        **tag,
        "forwards": int(curve[-1]["forwards"]),
        "steps": len(steps),
        "train_loss": float(curve[-1]["train_loss"]),
        "peak_memory_bytes": peak_memory(device),
        "device": str(device),
        "dtype": cfg["pretrained"]["dtype"],
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
    models: str,
    splits: Mapping[str, str],
    cfg: Mapping[str, Any],
) -> pd.DataFrame:
    """Dev and test loss and accuracy (argmax over the label words) of one run's final weights."""
    from paperflow.core.device import pick
    from paperflow.core.lm.models import load_weights

    device = pick(cfg["pretrained"]["device"], key="pretrained.device")
    model = load_weights(_model(pretrained_json, cfg["pretrained"], device), models)
    row = {"task": task, "method": method, "seed": int(seeds[0])}
    for name, path in splits.items():
        split, scorer = _split(path, device)
        row[f"{name}_loss"], row[f"{name}_accuracy"] = scorer.evaluate(model, split)
        row[f"{name}_rows"] = len(split)
    return pd.DataFrame([row])
