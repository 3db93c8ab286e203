"""UKA's paper-scale stages with their files (source.kind esconv), one function per rule of workflows/uka/paper.smk.

download_data(data, outputs)          ESConv, PPDPP's train / test split files, each by its pinned sha256
preprocess(raw, embedding, outs)      the cases of both splits, and the situation vocabulary embedded (MiniLM)
tom(...)                              the LLM's theory-of-mind likelihood L~[need, strategy, feedback]
train(method, ...)                    self-play knowledge acquisition on the training cases -> memory + attempts
evaluate(method, ...)                 the test dialogues -> per case, per turn, transcripts
win_rate(method, ...)                 the LLM judge on the paired test transcripts of `method` and the reference

Every LLM stage but the judge runs inside `backbone(...)`: the job's own vLLM server on its GPU (or
`server.base_url`); the win-rate stage runs inside `judge(...)`: the judge's model, served the same way (or
`server.judge_base_url`). The backbone (`pretrained`) and the judge (`judge`) are downloaded by the shared stage
(paperflow.core.hub_download, rules/common.smk's hub_model_stage).

train, evaluate and win_rate resume (README, "Long jobs resume"): `journal`, a file in the job's checkpoint folder,
keeps each finished LLM unit (a simulated turn, a judged pair) of every seed, and a rerun asks only the rest
(dialogue's module docstring); None (a call outside a job) keeps them in a scratch folder for the call only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.io import read_frame, write_frame
from paperflow.core.lm.serve import Client
from paperflow.core.resume import row_journal
from paperflow.uka import agents as ag
from paperflow.uka import dialogue as dl
from paperflow.uka import esconv
from paperflow.uka.llm import JUDGE_NAME, SERVED_NAME, served, vllm_command
from paperflow.uka.memory import memory_from_frame

log = logging.getLogger(__name__)
SLUG = "uka"
SPLITS = ("train", "test")


def download_data(data: Mapping[str, Any], outputs: Mapping[str, str]) -> dict[str, int]:
    """Each split file of `data` (url + sha256, else the lock file's) fetched to its output; the dialogues per split."""
    from paperflow.core.download import pinned_fetch

    counts = {}
    for split in SPLITS:
        spec = data[split]
        pinned_fetch(spec["url"], outputs[split], spec.get("sha256"), slug=SLUG, key=f"data.{split}.sha256")
        counts[split] = sum(1 for line in Path(outputs[split]).read_text().splitlines() if line.strip())
    return counts


def preprocess(
    raw: Mapping[str, str], embedding: Mapping[str, Any], out_cases: str, out_embeddings: str, encode=None
) -> pd.DataFrame:
    """Both splits' cases as one table, and the embedded situation vocabulary (`encode` overrides the encoder)."""
    cases = pd.concat([esconv.read_cases(raw[s], s) for s in SPLITS], ignore_index=True)
    write_frame(out_cases, cases, {"source": "esconv"})
    write_frame(out_embeddings, esconv.embed_vocabulary(cases, dict(embedding), encode), {"encoder": embedding["kind"]})
    return cases


@contextmanager
def _model_server(model_json: str, cfg: Mapping[str, Any], log_path: str, key: str, name: str, url_key: str):
    server, model = cfg["server"], cfg[key]
    command = None
    if not server.get(url_key):
        from paperflow.core.device import pick

        pick(model["device"], key=f"uka {key}.device")
        folder = json.loads(Path(model_json).read_text())["folder"]
        command = vllm_command(folder, server, cfg["resources"]["gpus"], model["dtype"], name)
    with served(command, server, log_path, name, url_key) as client:
        yield client


@contextmanager
def backbone(pretrained_json: str, cfg: Mapping[str, Any], log_path: str) -> Iterator[Client]:
    """The job's LLM client: the config's `server.base_url`, else a vLLM server on this job's GPUs started here.
    `pretrained.device: cuda` makes a job that sees no GPU fail naming that key before anything starts."""
    with _model_server(pretrained_json, cfg, log_path, "pretrained", SERVED_NAME, "base_url") as client:
        yield client


@contextmanager
def judge(judge_json: str, cfg: Mapping[str, Any], log_path: str) -> Iterator[Client]:
    """The judge's client: `server.judge_base_url`, else a vLLM server of the judge's model (`judge`, not the
    backbone: the backbone would grade its own dialogues) started here."""
    with _model_server(judge_json, cfg, log_path, "judge", JUDGE_NAME, "judge_base_url") as client:
        yield client


def _cases(path: str, split: str) -> pd.DataFrame:
    frame = read_frame(path)[0]
    out = frame[frame["split"] == split].sort_values("case").reset_index(drop=True)
    if out.empty:
        raise ValueError(f"{path}: no {split} cases; rerun preprocess")
    return out


def _setting(cases_path: str, embeddings_path: str, cfg: Mapping[str, Any]):
    cases = read_frame(cases_path)[0]
    emb = esconv.embeddings_from_frame(read_frame(embeddings_path)[0], cases)
    emotions, problems = esconv.vocabulary(cases)
    return ag.Settings.from_config(cfg), emb, dl.Axes(emotions, problems)


def tom(client: Client, cfg: Mapping[str, Any], out: str) -> dict[str, Any]:
    """The elicited ToM likelihood as JSON (table, counts, unparsed answers)."""
    doc = dl.elicit_tom(dl.Roles(client, cfg["llm"]), int(cfg["tom"]["samples"]), int(cfg["seeds"][0]))
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def train(
    client: Client,
    method: str,
    cases: str,
    embeddings: str,
    tom_json: str,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    journal: str | Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`method`'s knowledge acquisition per seed on the training cases: (memory rows, attempt rows), with seeds."""
    settings, emb, axes = _setting(cases, embeddings, cfg)
    train_cases, tom_doc = _cases(cases, "train"), json.loads(Path(tom_json).read_text())
    if len(train_cases) < settings.dialogues:
        raise ValueError(f"{len(train_cases)} training cases for training.dialogues = {settings.dialogues}")
    roles, memories, attempts = dl.Roles(client, cfg["llm"]), [], []
    with row_journal(journal, key="key") as done:
        for seed in seeds:
            agent = dl.make_agent(method, settings, tom_doc, emb, ag.new_memory(method))
            rows = dl.acquire(
                roles, agent, axes, train_cases, settings, float(cfg["critic"]["success_reward"]), seed, done
            )
            memories.append(agent.memory.frame().assign(seed=seed))
            attempts.append(rows.assign(seed=seed, method=method))
            log.info("%s seed %d: %d attempts, %d memory entries", method, seed, len(rows), len(agent.memory))
    return pd.concat(memories, ignore_index=True), pd.concat(attempts, ignore_index=True)


def evaluate(
    client: Client,
    method: str,
    cases: str,
    embeddings: str,
    tom_json: str,
    memory: str | None,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    journal: str | Path | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """`method`'s test dialogues per seed: (per case, per turn, transcripts), each with seed and method."""
    settings, emb, axes = _setting(cases, embeddings, cfg)
    test_cases, tom_doc = _cases(cases, "test"), json.loads(Path(tom_json).read_text())
    mem_frame = read_frame(memory)[0] if memory else None
    roles, per_case, per_turn, transcripts = dl.Roles(client, cfg["llm"]), [], [], []
    with row_journal(journal, key="key") as done:
        for seed in seeds:
            mem = None
            if mem_frame is not None:
                # no entry at all: self-play never won a turn (possible with an LLM critic); the memory is empty
                mem = memory_from_frame(mem_frame[mem_frame["seed"] == seed]) or ag.new_memory(method)
                if not len(mem):
                    log.warning("%s: the memory of seed %d is empty (no turn won in self-play)", memory, seed)
            agent = dl.make_agent(method, settings, tom_doc, emb, mem, ag.belief_shuffle(method, seed, len(test_cases)))
            pc, pt, tr = dl.run_test(
                roles,
                agent,
                axes,
                test_cases,
                settings,
                float(cfg["critic"]["success_reward"]),
                seed,
                int(cfg["server"]["concurrency"]),
                done,
            )
            per_case.append(pc.assign(seed=seed, method=method))
            per_turn.append(pt.assign(seed=seed, method=method))
            transcripts += [{**t, "seed": seed, "method": method} for t in tr]
    return pd.concat(per_case, ignore_index=True), pd.concat(per_turn, ignore_index=True), transcripts


def write_transcripts(path: str, transcripts: Sequence[Mapping]) -> None:
    with open(path, "w") as fh:
        for t in transcripts:
            fh.write(json.dumps(t) + "\n")


def read_transcripts(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def win_rate(
    client: Client,
    method: str,
    reference: str,
    mine: str,
    theirs: str,
    cases: str,
    cfg: Mapping[str, Any],
    seeds: Sequence[int],
    journal: str | Path | None = None,
) -> pd.DataFrame:
    """Per seed and test case, the judge's preference for `method`'s dialogue over `reference`'s (see
    dialogue.win_rates for the order and tie rule)."""
    test_cases, roles = _cases(cases, "test"), dl.Roles(client, cfg["llm"])
    a, b, frames = read_transcripts(mine), read_transcripts(theirs), []
    with row_journal(journal, key="key") as done:
        for seed in seeds:
            mine_s, theirs_s = [t for t in a if t["seed"] == seed], [t for t in b if t["seed"] == seed]
            wins = dl.win_rates(roles, test_cases, mine_s, theirs_s, seed, int(cfg["server"]["concurrency"]), done)
            frames.append(wins.assign(seed=seed, method=method, reference=reference))
    return pd.concat(frames, ignore_index=True)
