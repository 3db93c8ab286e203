"""dualreform at paper scale (`source.kind: topiocqa`), one function per rule: the pretrained CQR model and TopiOCQA
(conversations and corpus) at pinned Hub commits, the candidate table with BM25 over the corpus, each preference
method's rounds (pseudo references -> TRL SFT -> TRL DPO, LoRA on the pretrained model) per seed, and test-turn
retrieval of each model. The scripts only pass paths and params; the smoke scale's stages are `prepare` and
`stages`, whose references, preferences and metrics (`pipeline`, `retrieval`) are reused here unchanged.

Methods: `raw` (the question as is), `prompted` (the pretrained instruct model ranks the candidates zero-shot: the
LLM-based baseline, and the model every trained method starts from), `retpo` (gold references: the upper bound),
`dualreform` (responses refined by the CQR model itself: iteration 1 by the pretrained model, iteration i by the
model of iteration i - 1), `single_role` (responses + the current question) and `random_ref` (the control).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.core.resume import EVERY_S
from paperflow.dualreform import pipeline
from paperflow.dualreform import topiocqa as tq
from paperflow.dualreform.settings import TRAINED

log = logging.getLogger(__name__)
SLUG = "dualreform"
LIST_COLUMNS = ("hist_queries", "hist_responses", "qcands", "rcands", "q_gold_rank", "r_top1")


def _fetch(ref: Mapping[str, Any], key: str, cache: str, patterns: list[str]) -> tuple[Path, str]:
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    revision = pinned_revision(ref["hub"], ref["revision"], slug=SLUG, key=key, repo_type=ref["repo_type"])
    folder = snapshot_folder(cache, ref["repo_type"], ref["hub"], revision)
    download_pretrained(ref["hub"], revision, folder, allow_patterns=patterns, repo_type=ref["repo_type"])
    return folder, revision


def download_model(pretrained: Mapping[str, Any], cache: str, out: str, key: str = "pretrained") -> dict[str, str]:
    """A model's files (`<key>.files`) at its pinned commit into the cache; `out` (JSON) names the commit and the
    folder, which every later rule loads offline. `key` is the config key (pretrained, or dense for the encoder)."""
    folder, revision = _fetch(pretrained, f"{key}.revision", cache, list(pretrained["files"]))
    doc = {"hub": pretrained["hub"], "revision": revision, "folder": str(folder)}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _first_conversations(records: list[dict], limit: int | None) -> list[dict]:
    if limit is None:
        return records
    keep = sorted({int(r["Conversation_no"]) for r in records})[: int(limit)]
    return [r for r in records if int(r["Conversation_no"]) in set(keep)]


def download_data(data: Mapping[str, Any], cache: str, out_passages: str, out_turns: str) -> dict[str, int]:
    """TopiOCQA's conversation files and corpus shards (only those) at their pinned commits, written as the smoke
    path's raw tables: passages (pid, docid, text) and turns (with each gold passage's pid). `data.conversations`
    limits the conversations per split (the first N by number; null keeps all)."""
    conv, corpus = data["conversations"], data["corpus"]
    conv_folder, conv_rev = _fetch(conv, "data.conversations.revision", cache, list(tq.CONVERSATION_FILES.values()))
    corpus_folder, corpus_rev = _fetch(corpus, "data.corpus.revision", cache, [tq.CORPUS_PATTERN])
    passages = tq.read_corpus(corpus_folder)
    records = {
        split: _first_conversations(tq.read_jsonl(conv_folder / name), data["limit_conversations"][split])
        for split, name in tq.CONVERSATION_FILES.items()
    }
    turns, dropped = tq.turns_table(records, passages["docid"])
    if dropped:
        log.warning("%d turns whose gold passage is not in the corpus were dropped", dropped)
    origin = {
        "conversations": {"hub": conv["hub"], "revision": conv_rev},
        "corpus": {"hub": corpus["hub"], "revision": corpus_rev},
    }
    write_frame(out_passages, passages, {"origin": origin})
    write_frame(out_turns, turns, {"origin": origin, "dropped_turns": dropped})
    counts = {f"{s}_turns": int((turns["split"] == s).sum()) for s in tq.CONVERSATION_FILES}
    return {**counts, "passages": len(passages), "dropped_turns": dropped}


def preprocess(
    passages: str, turns: str, bm25: Mapping[str, Any], threads: int, out: str, checkpoint: str | Path | None = None
) -> pd.DataFrame:
    """The candidate table: every turn's six rewrite and six refinement candidates with their BM25 rankings.
    `checkpoint` (the job's checkpoint folder): the BM25 index is saved there once built and loaded by a rerun, and
    the retrieval is journalled in batches of turns, a rerun retrieving only the batches left (None: no checkpoint)."""
    from paperflow.core.resume import row_journal

    pas, _ = read_frame(passages)
    tur, _ = read_frame(turns)
    tur = _lists(tur, ("hist_queries", "hist_responses"))
    folder = Path(checkpoint) if checkpoint is not None else None
    index = tq.CorpusBM25(
        pas["text"].tolist(), bm25["k1"], bm25["b"], threads=threads, folder=folder / "bm25" if folder else None
    )
    if folder is None:
        table = tq.candidate_table(tur, index, pipeline.DEPTH)
    else:
        with row_journal(folder / "candidates.jsonl", key="start") as journal:
            table = tq.candidate_table(tur, index, pipeline.DEPTH, journal=journal)
    write_frame(out, table, {"bm25": dict(bm25), "templates": list(tq.TEMPLATES), "n_passages": len(pas)})
    return table


def index_dense(
    passages: str, dense_json: str, dense: Mapping[str, Any], out: str, checkpoint: str | Path | None = None
) -> tuple[int, int]:
    """The corpus encoded by the dense retriever (float16 [n_passages, dim] .npy). `checkpoint` (the job's
    checkpoint folder): the chunks encoded so far are kept there and a rerun encodes the rest (None: no checkpoint)."""
    from paperflow.core.device import pick
    from paperflow.dualreform import dense as dn

    pas, _ = read_frame(passages)
    model = dn.encoder(dense_json, dense, pick(dense["device"], key="dense.device"))
    return dn.index_corpus(model, pas["text"].tolist(), int(dense["batch_size"]), out, checkpoint=checkpoint)


def _lists(frame: pd.DataFrame, columns) -> pd.DataFrame:
    out = frame.copy()
    for col in columns:
        out[col] = [[x.item() if hasattr(x, "item") else x for x in v] for v in out[col]]
    return out


def read_table(path: str) -> tuple[pd.DataFrame, dict]:
    frame, meta = read_frame(path)
    frame = _lists(frame, LIST_COLUMNS)
    frame["q_top"] = [[list(r) for r in v] for v in frame["q_top"]]
    return frame, meta


def _tokenizer(pretrained_json: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        json.loads(Path(pretrained_json).read_text())["folder"], local_files_only=True
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _model(pretrained_json: str, pretrained: Mapping[str, Any], device):
    from paperflow.core.lm.models import load_pretrained

    info = json.loads(Path(pretrained_json).read_text())
    return load_pretrained(
        info["hub"], info["revision"], info["folder"], dtype=pretrained["dtype"], device=device
    ).eval()


def _pretrained(pretrained_json: str, pretrained: Mapping[str, Any], device):
    """(the pretrained model on `device` in eval mode, its tokenizer with a pad token)."""
    return _model(pretrained_json, pretrained, device), _tokenizer(pretrained_json)


def _ranker(pretrained: Mapping[str, Any]) -> dict[str, int]:
    return {"batch_size": int(pretrained["score_batch_size"]), "max_prompt": int(pretrained["max_prompt_tokens"])}


class _Stages:
    """A training job's finished stages (each round's references, SFT adapter and DPO round) in its checkpoint folder
    `it<i>/`, each with its history, the random generators' states when it ended and a `<stage>.done` marker written
    last; None keeps nothing (every stage runs)."""

    def __init__(self, folder: str | Path | None) -> None:
        self.folder = None if folder is None else Path(folder)

    def path(self, it: int, name: str) -> Path:
        return self.folder / f"it{it}" / name

    def trainer_dir(self, it: int, stage: str, work: Path) -> Path:
        """TRL's output_dir: the stage's own folder here (its timed checkpoints), else the scratch `work`."""
        return work / stage if self.folder is None else self.path(it, f"{stage}_trainer")

    def done(self, it: int, stage: str) -> bool:
        return self.folder is not None and self.path(it, f"{stage}.done").exists()

    def save(self, it: int, stage: str, refs=None, adapters=None, lora_cfg=None, history=None) -> None:
        import torch

        from paperflow.core.seeding import rng_states
        from paperflow.dualreform import lora

        if self.folder is None:
            return
        self.path(it, "").mkdir(parents=True, exist_ok=True)
        if refs is not None:
            np.save(self.path(it, "refs.npy"), np.asarray(refs))
        if adapters is not None:
            lora.save_round(adapters, lora_cfg, self.path(it, f"{stage}.safetensors"))
        if history is not None:
            history.to_pickle(self.path(it, f"{stage}_history.pkl"))
        torch.save(rng_states(), self.path(it, f"{stage}_rng.pt"))
        marker = self.path(it, f"{stage}.done")
        marker.with_suffix(".tmp").write_text(f"{stage} of round {it}\n")
        marker.with_suffix(".tmp").replace(marker)
        shutil.rmtree(self.path(it, f"{stage}_trainer"), ignore_errors=True)  # its timed checkpoints: not needed

    def load(self, it: int, stage: str) -> dict[str, Any]:
        """A finished stage's results; the random generators go back to where they were when it ended."""
        import torch

        from paperflow.core.seeding import set_rng_states
        from paperflow.dualreform import lora

        out: dict[str, Any] = {}
        if stage == "refs":
            out["refs"] = np.load(self.path(it, "refs.npy"))
        else:
            out["adapters"] = lora.read_round(self.path(it, f"{stage}.safetensors"))[0]
            out["history"] = pd.read_pickle(self.path(it, f"{stage}_history.pkl"))
        set_rng_states(torch.load(self.path(it, f"{stage}_rng.pt"), weights_only=True))
        return out

    @staticmethod
    def quiet(load):
        """`load()` with the random generators left as they were (a model rebuilt from a saved stage draws LoRA's
        initial weights, which the uninterrupted run never drew)."""
        from paperflow.core.seeding import rng_states, set_rng_states

        states = rng_states()
        try:
            return load()
        finally:
            set_rng_states(states)


def train(
    method: str,
    seed: int,
    table_path: str,
    pretrained_json: str,
    cfg: Mapping[str, Any],
    outputs: Mapping[str, Any],
    checkpoint: str | Path | None = None,
    every_s: float = EVERY_S,
) -> pd.DataFrame:
    """`method`'s rounds for one seed, each from the pretrained model: references (the dual role: ranked by the
    latest model), SFT on the best candidates, DPO on (best, worse). Writes each round's adapters
    (outputs["checkpoints"][i - 1]), the training history and the references; returns the history.

    `checkpoint` (the job's checkpoint folder; README, "Long jobs resume"): each round's references, SFT adapter and
    DPO round are kept there as they finish, and TRL's trainers save there at least every `every_s` seconds; a rerun
    with the same folder loads the finished stages and resumes the unfinished one, ending where an uninterrupted
    run ends. None: no checkpoints (as before)."""
    from paperflow.core.device import pick
    from paperflow.core.seeding import seed_all
    from paperflow.dualreform import lora

    if method not in TRAINED:
        raise ValueError(f"method {method!r} is not trained; trained methods: {list(TRAINED)}")
    device = pick(cfg["pretrained"]["device"], key="pretrained.device")
    table, meta = read_table(table_path)
    train_turns = table[table["split"] == "train"].reset_index(drop=True)
    q_top = np.stack([np.asarray(t) for t in train_turns["q_top"]])
    r_top1 = np.stack(train_turns["r_top1"].to_numpy())
    qc = list(train_turns["qcands"])
    gold = train_turns["gold_pid"].to_numpy()
    n_iter = int(cfg["iterations"]) if method == "dualreform" else 1
    if len(outputs["checkpoints"]) != n_iter:
        raise ValueError(f"{method}: {n_iter} rounds but {len(outputs['checkpoints'])} checkpoint paths")
    stages = _Stages(checkpoint)
    timed = every_s if checkpoint is not None else None
    histories, ref_rows = [], []
    seed_all(seed)
    tok = _tokenizer(pretrained_json)
    refiner = None  # dualreform: the model that ranks the refinements (the pretrained one, then the latest round's)
    prompts = lora.rewrite_prompts(tok, train_turns)

    def pretrained_model():
        return _model(pretrained_json, cfg["pretrained"], device)

    def saved_model(path: Path):  # a stage finished by an earlier run: its adapters on the pretrained model
        return stages.quiet(lambda: lora.apply_round(pretrained_model(), path))

    for it in range(1, n_iter + 1):
        if stages.done(it, "refs"):
            refs = stages.load(it, "refs")["refs"]
        else:
            if method == "dualreform":
                if refiner is None and it == 1:
                    refiner = pretrained_model()
                elif refiner is None:  # the previous round finished in an earlier run
                    refiner = saved_model(stages.path(it - 1, "dpo.safetensors")).eval()
                choice = lora.rank_candidates(
                    refiner,
                    tok,
                    lora.refine_prompts(tok, train_turns),
                    list(train_turns["rcands"]),
                    **_ranker(cfg["pretrained"]),
                )
                refs = r_top1[np.arange(len(train_turns)), choice]
            else:
                refs = pipeline.pseudo_references(
                    method, train_turns, int(meta["n_passages"]), np.random.default_rng([seed, 2])
                )
            stages.save(it, "refs", refs=refs)
        ref_rows.append(
            pd.DataFrame({"iteration": it, "turn_index": np.arange(len(train_turns)), "ref": refs, "gold": gold})
        )
        best, worse = pipeline.preferences(pipeline.reference_ranks(q_top, refs), np.random.default_rng([seed, 1]))
        pairs = [i for i in range(len(train_turns)) if worse[i] >= 0]
        if not pairs:
            raise ValueError(f"{method} iteration {it}: every candidate ties on every turn; no DPO pair")
        work = Path(tempfile.mkdtemp(prefix=f"dualreform_{method}_seed{seed}_it{it}_"))  # TRL's output_dir (unused)
        model = None
        if stages.done(it, "sft"):
            done = stages.load(it, "sft")
            sft_adapter, h_sft = done["adapters"]["sft"], done["history"]
        else:
            model = pretrained_model()
            model, sft_adapter, h_sft = lora.train_sft(
                model,
                tok,
                prompts,
                [qc[i][best[i]] for i in range(len(qc))],
                cfg["lora"],
                cfg["trl_sft"],
                seed,
                stages.trainer_dir(it, "sft", work),
                device,
                every_s=timed,
            )
            stages.save(it, "sft", adapters={"sft": sft_adapter}, lora_cfg=cfg["lora"], history=h_sft)
        if stages.done(it, "dpo"):
            done = stages.load(it, "dpo")
            dpo_adapter, h_dpo = done["adapters"]["dpo"], done["history"]
            model = None
        else:
            if model is None:  # the SFT stage finished in an earlier run
                model = saved_model(stages.path(it, "sft.safetensors"))
            model, dpo_adapter, h_dpo = lora.train_dpo(
                model,
                tok,
                [prompts[i] for i in pairs],
                [qc[i][best[i]] for i in pairs],
                [qc[i][worse[i]] for i in pairs],
                cfg["lora"],
                cfg["trl_dpo"],
                seed,
                stages.trainer_dir(it, "dpo", work),
                device,
                every_s=timed,
            )
            adapters = {"sft": sft_adapter, "dpo": dpo_adapter}
            stages.save(it, "dpo", adapters=adapters, lora_cfg=cfg["lora"], history=h_dpo)
        shutil.rmtree(work, ignore_errors=True)
        lora.save_round({"sft": sft_adapter, "dpo": dpo_adapter}, cfg["lora"], outputs["checkpoints"][it - 1])
        histories += [
            h_sft.assign(phase=f"{method} it{it} sft"),
            h_dpo.assign(phase=f"{method} it{it} dpo", n_pairs=len(pairs)),
        ]
        for h in histories[-2:]:
            h["iteration"] = it
        refiner = model.eval() if model is not None else None
    history = pd.concat(histories, ignore_index=True).assign(seed=seed, method=method)
    history.to_csv(outputs["history"], index=False)
    write_frame(outputs["refs"], pd.concat(ref_rows, ignore_index=True).assign(seed=seed), {"method": method})
    return history


def evaluate(
    method: str,
    seed: int,
    table_path: str,
    pretrained_json: str | None,
    checkpoints: Mapping[int, str],
    pretrained: Mapping[str, Any] | None,
    dense: Mapping[str, Any] | None = None,
    journal: str | Path | None = None,
) -> pd.DataFrame:
    """Test-turn retrieval of a method per iteration (`raw`: the question; `prompted`: the pretrained model's
    ranking; a trained method: each round's model): MRR, nDCG@3, R@10, R@100 under BM25 and the share of each
    template; with `dense` ({"json", "index", "settings"}), the same metrics of the dense retriever, prefixed
    "dense_", for the same chosen rewrites. `journal` (a file in the job's checkpoint folder): each iteration's row
    is kept there as it finishes and a rerun evaluates only the iterations it lacks (None: a scratch journal)."""
    from paperflow.core.resume import row_journal

    table, _ = read_table(table_path)
    test = table[table["split"] == "test"].reset_index(drop=True)
    runs: dict[int, str | None] = {0: None} if method in ("raw", "prompted") else dict(checkpoints)
    with row_journal(journal, key="iteration") as rows:
        for it, path in rows.todo(sorted(runs.items()), key=lambda run: run[0]):
            row = _evaluate_iteration(method, seed, test, it, path, pretrained_json, pretrained, dense)
            rows.append({"iteration": it, "row": list(row.items())})  # pairs: the columns keep their order
        return pd.DataFrame([dict(r["row"]) for r in rows.complete(sorted(runs))])


def _evaluate_iteration(method, seed, test, it, path, pretrained_json, pretrained, dense) -> dict[str, Any]:
    """One iteration's row of `evaluate`."""
    from paperflow.dualreform.retrieval import retrieval_metrics

    if method == "raw":
        choice = np.zeros(len(test), dtype=int)
    else:
        from paperflow.core.device import pick
        from paperflow.dualreform import lora

        device = pick(pretrained["device"], key="pretrained.device")
        model, tok = _pretrained(pretrained_json, pretrained, device)
        if path is not None:
            model = lora.apply_round(model, path).eval()
        prompts = lora.rewrite_prompts(tok, test)
        choice = lora.rank_candidates(model, tok, prompts, list(test["qcands"]), **_ranker(pretrained))
        del model
    ranks = np.stack(test["q_gold_rank"].to_numpy())[np.arange(len(test)), choice]
    shares = np.bincount(choice, minlength=len(tq.TEMPLATES)) / max(len(test), 1)
    row = {"method": method, "seed": seed, "iteration": it, **retrieval_metrics(ranks)}
    if dense is not None:
        row |= {f"dense_{k}": v for k, v in _dense_metrics(test, choice, dense).items()}
    row |= {f"share_{name}": float(shares[k]) for k, name in enumerate(tq.TEMPLATES)}
    return row


def _dense_metrics(test: pd.DataFrame, choice: np.ndarray, dense: Mapping[str, Any]) -> dict[str, float]:
    from paperflow.core.device import pick
    from paperflow.dualreform import dense as dn
    from paperflow.dualreform.retrieval import retrieval_metrics

    settings = dense["settings"]
    device = pick(settings["device"], key="dense.device")
    encoder = dn.encoder(dense["json"], settings, device)
    texts = [cands[c] for cands, c in zip(test["qcands"], choice)]
    vectors = dn.encode(encoder, texts, int(settings["batch_size"]))
    tops = dn.top(dense["index"], vectors, pipeline.DEPTH, device)
    return retrieval_metrics(dn.gold_ranks(tops, test["gold_pid"].to_numpy()))
