"""DOUBT's stages with their files, one function per rule (the scripts only pass paths and params).
Only `evaluate` reads the ground-truth answers (spec section 9: gt stays out of every scoring step)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame, write_frame
from paperflow.core.seeding import seed_all
from paperflow.doubt import methods as M
from paperflow.doubt import metrics, scores
from paperflow.doubt.scenes import FEATURE_DIM, N_CELLS, draw_items
from paperflow.doubt.surfaces import WRAP, canonical, dev_surfaces, surface_variety, vocabulary_words

log = logging.getLogger(__name__)
SETS = ("A", "B")


def download(source: Mapping[str, Any], data: Mapping[str, Any], out: str) -> pd.DataFrame:
    """Synthetic grid-scene items (train and test splits, seeded); the paper-scale benchmarks are not read here
    (workflows/doubt/paper.smk, `paperflow.doubt.paper`)."""
    if source["kind"] != "synthetic":
        raise ConfigError(
            f"doubt source {source['kind']!r}: this stage builds the synthetic grid scenes only; the paper-scale "
            "benchmarks are downloaded by the rules of workflows/doubt/paper.smk (paperflow.doubt.paper)"
        )
    sigmas, prior = tuple(data["sigmas"]), float(data["prior"])
    frames = [
        pd.DataFrame(draw_items(int(data[f"n_{split}"]), int(data["seed"]) + k, prior, sigmas)).assign(split=split)
        for k, split in enumerate(("train", "test"))
    ]
    frame = pd.concat(frames, ignore_index=True)
    write_frame(out, frame, {"data": dict(data)})
    return frame


def read_split(path: str, split: str) -> tuple[list[dict], np.ndarray]:
    frame = read_frame(path)[0]
    frame = frame[frame["split"] == split].reset_index(drop=True)
    cells = np.stack(frame["features"].map(np.asarray).to_list()).astype(np.float32).reshape(-1, N_CELLS, FEATURE_DIM)
    return frame.drop(columns="features").to_dict("records"), cells


def preprocess(vocabulary_out: str, clusterer_out: str, batch_size: int) -> dict[str, Any]:
    """The vocabulary, and the semantic clusterer's cosine threshold chosen on the dev paraphrase set (every
    answer template x value, wrapped as the embedded strings are; spec section 11)."""
    from paperflow.core.lm.encoders import encode_sentences

    Path(vocabulary_out).write_text(json.dumps(vocabulary_words(), indent=1))
    dev = dev_surfaces()
    emb = encode_sentences([WRAP.format(s) for s, _ in dev], batch_size=batch_size).astype(np.float64)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    threshold, accuracy = scores.choose_threshold(unit, [c for _, c in dev])
    doc = {"threshold": threshold, "dev_pair_accuracy": accuracy, "dev_surfaces": len(dev)}
    Path(clusterer_out).write_text(json.dumps(doc, indent=2))
    return doc


def train(scenes: str, model_cfg, train_cfg, seed: int, temperature: float, out: str) -> pd.DataFrame:
    from paperflow.doubt import vlm

    items, cells = read_split(scenes, "train")
    seed_all(seed)
    model, records = vlm.train(items, cells, model_cfg, train_cfg, seed, temperature)
    vlm.save(model, out)
    return pd.DataFrame(records).assign(seed=seed)


def sample(scenes: str, checkpoint: str, sampling: Mapping[str, Any], seed: int) -> pd.DataFrame:
    """Per test item (spec section 2): ans0 (T_answer), the plain set A (n_max at T), the object list (T_answer,
    once), the OUB set B (n_max at T on Q + desc + objects + ans). Batched: `sampling.batch_rows` rows per forward."""
    import torch

    from paperflow.doubt import vlm

    items, cells = read_split(scenes, "test")
    model, tok = vlm.load(checkpoint), vlm.tokenizer()
    g = torch.Generator().manual_seed(int(seed) * 1000 + int(sampling["seed"]))
    n, k, t, t0 = (
        int(sampling["n_max"]),
        int(sampling["top_k"]),
        float(sampling["temperature"]),
        float(sampling["t_answer"]),
    )
    length, list_length = int(sampling["max_new_tokens"]), int(sampling["max_list_tokens"])
    x = torch.as_tensor(cells)
    qs = [it["question"].split() for it in items]

    rows = sampling.get("batch_rows")

    def run(prompts, feats, max_new, temp):
        return vlm.sample_prefix(model, tok, prompts, feats, max_new, temp, k, g, rows)

    ans0 = run([vlm.IMG + q for q in qs], x, length, t0)
    plain = run([vlm.IMG + q for q in qs for _ in range(n)], x.repeat_interleave(n, 0), length, t)
    objs = run([vlm.IMG + ["list"]] * len(items), x, list_length, t0)
    oub_prompts = [vlm.IMG + q + ["desc"] + o + ["ans"] for q, o in zip(qs, objs)]
    oub = run([p for p in oub_prompts for _ in range(n)], x.repeat_interleave(n, 0), length, t)
    join = " ".join
    return pd.DataFrame(
        {
            "item": [it["item"] for it in items],
            "ans0": [join(a) for a in ans0],
            "objects_pred": [join(o) for o in objs],
            "A": [[join(a) for a in plain[i * n : (i + 1) * n]] for i in range(len(items))],
            "B": [[join(a) for a in oub[i * n : (i + 1) * n]] for i in range(len(items))],
        }
    ).assign(seed=seed)


def embed(samples: Sequence[str], batch_size: int) -> pd.DataFrame:
    """MiniLM embeddings of every distinct sampled answer, wrapped as "The answer of this question is X."
    (one batched call; the kit caches per string)."""
    from paperflow.core.lm.encoders import encode_sentences

    answers = sorted({a for p in samples for f in [read_frame(p)[0]] for s in SETS for row in f[s] for a in row})
    vectors = encode_sentences([WRAP.format(a) for a in answers], batch_size=batch_size)
    return pd.DataFrame({"answer": answers, "vector": list(vectors.astype(np.float32))})


def _scorer(embeddings: str, clusterer: str) -> tuple[M.Scorer, dict[str, int]]:
    frame = read_frame(embeddings)[0]
    table = frame["answer"].tolist()
    threshold = json.loads(Path(clusterer).read_text())["threshold"]
    scorer = M.Scorer(table, np.stack(frame["vector"].map(np.asarray).to_list()), threshold)
    return scorer, {a: i for i, a in enumerate(table)}


def _set_ids(frame: pd.DataFrame, index: Mapping[str, int]) -> dict[str, np.ndarray]:
    return {s: np.array([[index[a] for a in row] for row in frame[s]]) for s in SETS}


def score(method: str, samples: Mapping[int, str], embeddings: str, clusterer: str, scoring) -> pd.DataFrame:
    """One method's scores on every seed's sets, at every n of `scoring.ns` (`scoring.reps` random subsets
    below n_max)."""
    scorer, index = _scorer(embeddings, clusterer)
    frames = []
    for seed, path in sorted(samples.items()):
        sets = _set_ids(read_frame(path)[0], index)
        frames.append(M.score_seed(M.METHODS[method], seed, sets, scorer, scoring["ns"], int(scoring["reps"])))
    return pd.concat(frames, ignore_index=True).assign(method=method)


def label(scenes: str, samples: pd.DataFrame) -> np.ndarray:
    """wrong = canonical(ans0) differs from the gt answer (exact match of the parsed answer, the strict label)."""
    items, _ = read_split(scenes, "test")
    gt = {it["item"]: it["answer"] for it in items}
    return np.array([canonical(a) != gt[i] for i, a in zip(samples["item"], samples["ans0"])])


def evaluate(
    scenes: str, samples: Mapping[int, str], score_files: Mapping[str, str], embeddings: str, clusterer: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(metrics, items): per (method, seed, n) the AUROC (mean and std over sub-samplings) and the detection accuracy
    at the official threshold; per (seed, item) the label, noise, question kind, the plain set's largest semantic
    cluster, the surface variety of each set (`surfaces.surface_variety`: answers off their meaning's modal surface,
    of those counted) and every method's score and flag at n_max (the item-paired claims, C3, the flag rates)."""
    scorer, index = _scorer(embeddings, clusterer)
    items = pd.DataFrame(read_split(scenes, "test")[0])
    table = pd.concat([pd.read_parquet(p) for p in score_files.values()], ignore_index=True)
    rows, per_item = [], []
    for seed, path in sorted(samples.items()):
        frame = read_frame(path)[0]
        wrong = label(scenes, frame)
        n_max = len(frame["A"].iloc[0])
        largest = scorer.largest_cluster(_set_ids(frame, index)["A"])
        variety = {s: np.array([surface_variety(list(row), canonical) for row in frame[s]]) for s in SETS}
        full = table[(table["seed"] == seed) & (table["n"] == n_max)]
        flags = {m: g.sort_values("item")["flag"].to_numpy() for m, g in full.groupby("method")}
        values = {m: g.sort_values("item")["score"].to_numpy() for m, g in full.groupby("method")}
        per_item.append(
            items[["item", "kind", "sigma"]].assign(
                seed=seed,
                wrong=wrong,
                largest_plain_cluster=largest,
                **{f"variety_{k}_{s}": v[:, j] for s, v in variety.items() for j, k in enumerate(("off", "counted"))},
                **{f"flag_{m}": f for m, f in flags.items()},
                **{f"score_{m}": v for m, v in values.items()},
            )
        )
        for (method, n), g in table[table["seed"] == seed].groupby(["method", "n"]):
            reps = [r.sort_values("item") for _, r in g.groupby("rep")]
            aucs = [metrics.auroc(wrong, r["score"].to_numpy()) for r in reps]
            accs = [metrics.detection_accuracy(wrong, r["flag"].to_numpy() == 1) for r in reps]
            has_flag = not reps[0]["flag"].isna().all()
            rows.append(
                {
                    "method": method,
                    "seed": seed,
                    "n": n,
                    "auroc": float(np.mean(aucs)),
                    "auroc_std_subsamples": float(np.std(aucs)),
                    "detection_accuracy": float(np.mean(accs)) if has_flag else np.nan,
                    "distinct_values": int(reps[0]["score"].round(9).nunique()),
                    "wrong_rate": float(wrong.mean()),
                }
            )
    return pd.DataFrame(rows), pd.concat(per_item, ignore_index=True)
