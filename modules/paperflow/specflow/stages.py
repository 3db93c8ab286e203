"""SpecFlow's stages with their files, one function per rule (the scripts only pass paths and params)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.scenes import patch_objects, render, sample_scenes
from paperflow.specflow.baselines import BASELINES, Tokens
from paperflow.specflow.settings import N_CLASSES, budget_of, method_kind, specflow_config

log = logging.getLogger(__name__)


SPLITS = {"train": 0, "test": 1, "control": 2}


def make_scenes(data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The download stage at smoke scale (spec section 4, D2): counting scenes (1-5 objects; train + test) and the
    control's single-object scenes (test only), rendered. Arrays: images, instance map, count, split."""
    image, cnt, ctl = data["image"], data["count"], data["control"]
    n = int(cnt["n_train"]) + int(cnt["n_test"])
    parts = [
        sample_scenes(n, grid=image["grid"], min_objects=cnt["min_objects"], max_objects=cnt["max_objects"],
                      seed=cnt["seed"]),
        sample_scenes(int(ctl["n_test"]), grid=image["grid"], min_objects=1, max_objects=1, seed=ctl["seed"]),
    ]  # fmt: skip
    rendered = [
        render(sc, cell_px=image["cell_px"], object_px=tuple(image["object_px"]), texture=image["texture"], seed=s + 1)
        for sc, s in zip(parts, (cnt["seed"], ctl["seed"]))
    ]
    split = np.concatenate([
        np.where(np.arange(n) < int(cnt["n_train"]), SPLITS["train"], SPLITS["test"]),
        np.full(int(ctl["n_test"]), SPLITS["control"]),
    ]).astype(np.int8)  # fmt: skip
    instance = np.concatenate([r[1] for r in rendered])
    return {
        "images": np.concatenate([r[0] for r in rendered]),
        "instance": instance,
        "count": np.concatenate([p.count for p in parts]),
        "split": split,
    }


def preprocess(raw: Mapping[str, np.ndarray], image: Mapping[str, Any], max_objects: int) -> dict[str, np.ndarray]:
    """Labels (count - 1) and the per-patch object cover (n, N, max_objects) that object coverage reads."""
    covers = patch_objects(raw["instance"], image["patch"], max_objects)
    return {"images": raw["images"], "labels": raw["count"] - 1, "covers": covers, "count": raw["count"],
            "split": raw["split"]}  # fmt: skip


def write_task(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    np.savez_compressed(path, **arrays)


def read_task(path: str, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of a task file (only `keys`, when given: the images are the bulk of it)."""
    with np.load(path) as fh:
        return {k: fh[k] for k in (keys or fh.files)}


def grid_of(image: Mapping[str, Any]) -> tuple[int, int]:
    side = image["grid"] * image["cell_px"] // image["patch"]
    return side, side


def train_seeds(
    data_path: str,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    checkpoints: Mapping[int, str],
    tokens: Mapping[int, str],
) -> pd.DataFrame:
    """Train the stand-in once per seed on full inputs, save it, and extract the test split's tokens (spec section
    6, extract_tokens). Returns the per-step history of every seed."""
    import torch
    from safetensors.torch import save_model

    from paperflow.specflow.model import extract, train_standin

    data = read_task(data_path)
    tr, te = data["split"] == SPLITS["train"], data["split"] != SPLITS["train"]  # tokens of test + control
    histories = []
    for seed in seeds:
        t0 = time.perf_counter()
        model, rows = train_standin(
            cfg, data["images"][tr], data["labels"][tr], N_CLASSES, seed, cfg["train"], subset_budgets(cfg)
        )
        save_model(model, checkpoints[seed])
        toks = extract(model, data["images"][te], grid_of(cfg["data"]["image"]))
        with torch.no_grad():
            logits = model.reader(torch.from_numpy(toks.z).float())
        test = data["split"][te] == SPLITS["test"]
        acc = float((logits.argmax(1).numpy()[test] == data["labels"][te][test]).mean())
        np.savez(tokens[seed], z=toks.z, cls=toks.cls, cls_heads=toks.cls_heads, keys=toks.keys, attn=toks.attn)
        log.info("seed %d: full-token test accuracy %.3f (%.1f s)", seed, acc, time.perf_counter() - t0)
        histories.append(pd.DataFrame(rows).assign(seed=seed, test_accuracy_full=acc))
    return pd.concat(histories, ignore_index=True)


def subset_budgets(cfg: Mapping[str, Any]) -> list[int]:
    """The budgets K the reader is trained to read (random subsets of each): every ratio's K, when
    `reader.subsets` is on (the claims read these budgets); none otherwise (full tokens only)."""
    if not cfg["reader"].get("subsets", False):
        return []
    n = grid_of(cfg["data"]["image"])
    return sorted({budget_of(r, n[0] * n[1]) for r in cfg["ratios"]})


def read_tokens(path: str, grid: tuple[int, int]) -> Tokens:
    with np.load(path) as fh:
        return Tokens(**{k: fh[k] for k in ("z", "cls", "cls_heads", "keys", "attn")}, grid=grid)


def load_reader(path: str, cfg: Mapping[str, Any]):
    """The reader of a saved stand-in, without building the encoder (no transformers import)."""
    from safetensors.torch import load_file

    from paperflow.specflow.model import build_reader

    reader = build_reader(cfg["reader"], N_CLASSES)
    state = {k.removeprefix("reader."): v for k, v in load_file(path).items() if k.startswith("reader.")}
    reader.load_state_dict(state, strict=True)
    return reader.eval()


def condense(method: str, toks: Tokens, budget: int, cfg: Mapping[str, Any], seed: int, e: np.ndarray | None = None):
    """(tokens fed, kept indices or None, FastV's budget or None) of `method` at `budget` selected tokens (`e`:
    SpecFlow's energy of these tokens, when already computed)."""
    from paperflow.specflow.specflow import specflow

    kind = method_kind(method)
    if kind == "fastv":
        return toks.z, None, budget
    if kind == "specflow":
        fed, kept = specflow(toks.z, toks.cls, toks.grid, budget, specflow_config(method, cfg), attn=toks.attn, e=e)
        return fed, kept, None
    fed, kept = BASELINES[method](toks, budget, np.random.default_rng(seed))
    return fed, kept, None


def coverage(kept: np.ndarray | None, covers: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Object coverage (spec section 11) per scene: the share of its objects with at least one kept token (NaN for
    a method that keeps no token of the input, a pooling or merging one). Its mean over scenes weighs every scene
    alike."""
    if kept is None:
        return np.full(len(count), np.nan)
    hit = np.take_along_axis(covers, kept[..., None], axis=1).any(axis=1)  # (B, max_objects)
    return hit.sum(axis=1) / count


def quadtree_stats(
    method: str, toks: Tokens, cfg: Mapping[str, Any], e: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per scene, for a SpecFlow variant with the quadtree (its energy `e`): the number of quadtree leaves and
    std(E) / delta (the root splits only where this exceeds 1); NaN for every other method."""
    from paperflow.specflow.specflow import quadtree_leaves

    n = len(toks.z)
    if e is None or specflow_config(method, cfg).allocation != "quadtree":
        return np.full(n, np.nan), np.full(n, np.nan)
    sc = specflow_config(method, cfg)
    delta = 1.0 / e.shape[1] if sc.delta is None else sc.delta
    h, w = toks.grid
    leaves = np.array([len(quadtree_leaves(x.reshape(h, w), sc.m, delta)) for x in e], dtype=float)
    return leaves, e.std(axis=1) / delta


def evaluate_method(
    method: str,
    cfg: Mapping[str, Any],
    data_path: str,
    checkpoints: Mapping[int, str],
    token_paths: Mapping[int, str],
) -> pd.DataFrame:
    """Per scene (item), ratio and seed: whether `method`'s reading is right, whether the full-token reading of the
    same reader is, object coverage, tokens fed and pruning time, on the counting test split (task `count`) and
    the single-object control (task `control`)."""
    grid = grid_of(cfg["data"]["image"])
    parts = []
    data = read_task(data_path, ("labels", "covers", "count", "split"))
    split = data["split"][data["split"] != SPLITS["train"]]  # the order of the extracted tokens
    for seed, ckpt in sorted(checkpoints.items()):
        reader = load_reader(ckpt, cfg)
        all_toks = read_tokens(token_paths[seed], grid)
        for task, code in (("count", SPLITS["test"]), ("control", SPLITS["control"])):
            parts += _evaluate_split(method, cfg, reader, all_toks[split == code], data, code, task, seed)
    return pd.concat(parts, ignore_index=True)


def _evaluate_split(method, cfg, reader, toks: Tokens, data, code: int, task: str, seed: int) -> list[pd.DataFrame]:
    from paperflow.specflow.model import read

    sel = data["split"] == code
    labels, covers, count = data["labels"][sel], data["covers"][sel], data["count"][sel]
    full_correct = (read(reader, toks.z) == labels).astype(np.int8)
    e, e_ms = None, 0.0  # SpecFlow's energy: it does not depend on the budget, so it is computed (and timed) once
    if method_kind(method) == "specflow":
        from paperflow.specflow.specflow import energy

        t0 = time.perf_counter()
        e = energy(toks.z, toks.cls, specflow_config(method, cfg), toks.attn)
        e_ms = 1000 * (time.perf_counter() - t0) / len(labels)
    leaves, spread = quadtree_stats(method, toks, cfg, e)
    parts = []
    for ratio in cfg["ratios"]:
        budget = budget_of(ratio, toks.z.shape[1])
        t0 = time.perf_counter()
        fed, kept, fastv = condense(method, toks, budget, cfg, seed, e)
        ms = e_ms + 1000 * (time.perf_counter() - t0) / len(labels)
        correct = (read(reader, fed, fastv_keep=fastv) == labels).astype(np.int8)
        parts.append(pd.DataFrame({
            "method": method, "task": task, "seed": seed, "ratio": ratio, "budget": budget,
            "k_fed": int(fed.shape[1]) if fastv is None else budget, "item": np.arange(len(labels)),
            "correct": correct, "full_correct": full_correct, "coverage": coverage(kept, covers, count),
            "prune_ms": ms, "leaves": leaves, "energy_std_over_delta": spread,
        }))  # fmt: skip
    return parts
