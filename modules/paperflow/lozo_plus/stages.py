"""LOZO+'s stages with their files, one function per rule (the scripts only pass paths and params)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.io import read_frame

log = logging.getLogger(__name__)


def read_split(path: str):
    from paperflow.lozo_plus.training import split_of

    frame, _ = read_frame(path)
    return split_of(np.stack(frame["ids"].to_numpy()), frame["label"].to_numpy())


def pretrain(model_cfg, settings, source_test: str, test: str, out: str) -> pd.DataFrame:
    """The source model (AdamW on fresh source batches) and its history of source / target test accuracy."""
    from paperflow.core.lm.models import save_checkpoint
    from paperflow.core.seeding import seed_all
    from paperflow.lozo_plus import training
    from paperflow.lozo_plus.model import model_spec

    seed_all(int(settings["seed"]))
    checks = {"source_test": read_split(source_test), "target_test": read_split(test)}
    model, history = training.pretrain(model_cfg, settings, checks)
    save_checkpoint(model, out, model_spec(model_cfg))
    return pd.DataFrame(history)


def save_group(models: Mapping[int, Any], spec: Mapping[str, Any], out: str) -> None:
    """The final models of a seed group in one safetensors file (the kit's `save_checkpoints`, labels `seed<s>`)."""
    from paperflow.core.lm.models import save_checkpoints

    save_checkpoints({f"seed{s}": m for s, m in sorted(models.items())}, out, spec)


def load_group(path: str) -> dict[int, Any]:
    """{seed: model} from a `save_group` file (weights loaded strictly)."""
    from paperflow.core.lm.models import load_checkpoints

    return {int(label.removeprefix("seed")): m for label, m in load_checkpoints(path).items()}


def train(method: str, seeds: Sequence[int], source: str, train_path: str, cfg: Mapping[str, Any], outputs):
    """`method` fine-tuned from the source model for each seed at the forward budget; writes the group's models,
    curves (train loss vs forwards), per-step log and capture-ratio probes. Returns the final train losses."""
    from paperflow.core.lm.models import checkpoint_spec, load_checkpoint
    from paperflow.core.seeding import seed_all
    from paperflow.lozo_plus import training, zo

    train_split = read_split(train_path)
    models, curves, logs, probes, finals = {}, [], [], [], {}
    for seed in seeds:
        seed_all(int(seed))
        model = load_checkpoint(source)
        if method == "ft":
            curve, steps, align = training.finetune_fo(model, cfg["ft"], train_split, int(seed), cfg["run"])
        else:
            settings = zo.settings_from(cfg, method)
            curve, steps, align = training.finetune_zo(model, method, settings, train_split, int(seed), cfg["run"])
        tag = {"method": method, "seed": int(seed)}
        curves += [{**tag, **r} for r in curve]
        logs += [{**tag, **r} for r in steps]
        probes += [{**tag, **r} for r in align]
        models[int(seed)] = model
        finals[int(seed)] = curve[-1]["train_loss"]
        log.info(
            "%s seed %s: train loss %.4f at %d forwards", method, seed, curve[-1]["train_loss"], curve[-1]["forwards"]
        )
    save_group(models, checkpoint_spec(source), outputs["models"])
    pd.DataFrame(curves).to_csv(outputs["curve"], index=False)
    pd.DataFrame(logs).to_csv(outputs["log"], index=False)
    pd.DataFrame(probes, columns=["method", "seed", "step", "forwards"] + _probe_columns(probes)).to_csv(
        outputs["align"], index=False
    )
    return finals


def _probe_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted({k for r in rows for k in r} - {"method", "seed", "step", "forwards"})


def evaluate(groups: Mapping[tuple[str, str], str], source: str, dev: str, test: str) -> pd.DataFrame:
    """Dev and test accuracy (argmax over the label words) and loss of every final model and the source model."""
    from paperflow.core.lm.models import load_checkpoint
    from paperflow.lozo_plus.model import evaluate as score

    splits = {"dev": read_split(dev), "test": read_split(test)}
    rows = []

    def add(method: str, seed: int, model) -> None:
        row = {"method": method, "seed": seed}
        for name, s in splits.items():
            row[f"{name}_loss"], row[f"{name}_accuracy"] = score(model, s.ids, s.labels)
        rows.append(row)

    add("source", -1, load_checkpoint(source))
    for (method, _), path in sorted(groups.items()):
        for seed, model in load_group(path).items():
            add(method, seed, model)
    return pd.DataFrame(rows)
