"""UKA's stages with their files, one function per rule (the scripts only pass paths and params).

make_world(source, cfg, out_world, out_users)     download: NeedWorld's frozen tables and the users per seed
embed(cfg, out)                                   preprocess: every situation / (situation, need) text embedded
train(world, method, users, embeddings, cfg)      knowledge acquisition per seed -> memory + attempt log
evaluate(world, method, ...)                      test episodes per seed -> per-user and per-turn tables
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from paperflow.core.config import ConfigError
from paperflow.core.io import read_frame, write_frame
from paperflow.uka import agents as ag
from paperflow.uka import needworld as nw
from paperflow.uka.memory import Embeddings, memory_from_frame

log = logging.getLogger(__name__)


def make_world(source: Mapping[str, Any], cfg: Mapping[str, Any], out_world: str, out_users: str) -> pd.DataFrame:
    """The smoke "download": NeedWorld's tables (both worlds, with their digests) as JSON, and every seed's
    training and test users as a table. Paper scale (ESConv / ExTES through an LLM simulator) is refused."""
    if source["kind"] != "needworld":
        raise ConfigError(
            f"uka source.kind {source['kind']!r}: the paper-scale data (ESConv, ExTES, SAGE; spec section 4) are not "
            "pinned yet (issue 18) and the LLM agent / simulator / critic server is not wired, so this version "
            "refuses them; use source.kind: needworld"
        )
    if source.get("version", nw.VERSION) != nw.VERSION:
        raise ConfigError(f"uka source.version {source['version']!r}: this code implements {nw.VERSION!r} only")
    worlds = {
        name: {
            "digest": nw.table_digest(name),
            "mu": nw.mu_table().tolist(),
            "L": nw.likelihood_table(name).tolist(),
        }
        for name in ("main", "uninformative")
    }
    meta = {
        "version": nw.VERSION,
        "needs": nw.NEEDS,
        "strategies": nw.STRATEGIES,
        "feedback": nw.FEEDBACK,
        "phases": nw.PHASES,
        "verdicts": dict(zip(nw.VERDICT_TEXT, [None if np.isnan(v) else float(v) for v in nw.VERDICT_VALUE])),
        "worlds": worlds,
    }
    with open(out_world, "w") as fh:
        json.dump(meta, fh, indent=1)
    frames = []
    for seed in cfg["seeds"]:
        for split, users in (
            ("train", nw.sample_users(ag.stream(seed, "train_users"), int(cfg["training"]["dialogues"]))),
            ("test", ag.evaluation_users(seed, int(cfg["test"]["users"]))),
        ):
            frames.append(
                pd.DataFrame(
                    {
                        "seed": seed,
                        "split": split,
                        "user": np.arange(len(users)),
                        "need": users.need,
                        "d0": users.d0,
                        "emotion": users.emotion,
                        "problem": users.problem,
                    }
                )
            )
    frame = pd.concat(frames, ignore_index=True)
    write_frame(out_users, frame, {"version": nw.VERSION})
    return frame


def read_user_table(path: str) -> pd.DataFrame:
    frame, meta = read_frame(path)
    if meta.get("version") != nw.VERSION:
        raise ValueError(f"{path}: users of {meta.get('version')!r}, this code is {nw.VERSION!r}; rerun download")
    return frame


def read_users(path: str, seed: int, split: str) -> nw.Users:
    return users_of(read_user_table(path), seed, split)


def users_of(frame: pd.DataFrame, seed: int, split: str) -> nw.Users:
    """The `split` users of `seed` in the download's user table."""
    f = frame[(frame["seed"] == seed) & (frame["split"] == split)].sort_values("user")
    if f.empty:
        raise ValueError(f"no {split} users for seed {seed} in the user table; rerun download")
    return nw.Users(
        need=f["need"].to_numpy(int),
        d0=f["d0"].to_numpy(float),
        emotion=f["emotion"].to_numpy(int),
        problem=f["problem"].to_numpy(int),
    )


def read_embeddings(path: str) -> Embeddings:
    frame, _ = read_frame(path)
    return Embeddings.from_frame(frame)


def train(
    world: str, method: str, users: str, embeddings: str, cfg: Mapping[str, Any], seeds: Sequence[int]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Knowledge acquisition of `method` in `world`, seed by seed: (memory rows, attempt rows), both with a seed
    column. The training users are read from the download's table."""
    settings = ag.Settings.from_config(cfg)
    w, emb = nw.World.build(world), read_embeddings(embeddings)
    memories, attempts, table = [], [], read_user_table(users)
    for seed in tqdm(seeds, desc=f"uka train {world}/{method}", mininterval=5):
        train_users = users_of(table, seed, "train")
        agent, rows = ag.acquire(w, method, seed, settings, emb, users=train_users)
        memories.append(agent.memory.frame().assign(seed=seed))
        attempts.append(rows.assign(seed=seed))
        log.info("%s/%s seed %d: %d attempts, %d memory entries", world, method, seed, len(rows), len(agent.memory))
    return pd.concat(memories, ignore_index=True), pd.concat(attempts, ignore_index=True)


def evaluate(
    world: str,
    method: str,
    users: str,
    embeddings: str,
    memory: str | None,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`method`'s test episodes in `world` for every seed: (per user, per user and turn), with seed, world and
    method columns. The memory is the one its training method wrote (none for `standard`)."""
    settings = ag.Settings.from_config(cfg)
    w, emb = nw.World.build(world), read_embeddings(embeddings)
    mem_frame = read_frame(memory)[0] if memory else None
    per_user, per_turn, table = [], [], read_user_table(users)
    for seed in seeds:
        mem = None
        if mem_frame is not None:
            mem = memory_from_frame(mem_frame[mem_frame["seed"] == seed])
            if mem is None:
                raise ValueError(f"{memory}: no memory for seed {seed}; rerun the training stage")
        test = users_of(table, seed, "test")
        likelihood = ag.agent_likelihood(w, seed, settings, users_of(table, seed, "train"))
        agent = ag.Agent(method, settings, likelihood, emb, mem, ag.belief_shuffle(method, seed, len(test)))
        pu, pt = ag.run_episodes(w, agent, test, ag.evaluation_noise(seed, len(test), settings), settings)
        tags = {"world": world, "method": method, "seed": seed}
        per_user.append(pu.assign(**tags))
        per_turn.append(pt.assign(**tags))
    return pd.concat(per_user, ignore_index=True), pd.concat(per_turn, ignore_index=True)
