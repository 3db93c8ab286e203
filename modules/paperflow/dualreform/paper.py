"""dualreform at paper scale (`source.kind: topiocqa`), one function per rule: the pretrained CQR model and TopiOCQA
(conversations and corpus) at pinned Hub commits, the bm25s index of the corpus (an output of preprocess, with the
turns table), each preference method's rounds per seed (the model's sampled candidates ranked by BM25 -> pseudo
references -> TRL SFT -> TRL DPO, LoRA on the pretrained model), and test-turn retrieval with each model's greedy
rewrites. The CQR model writes at every scale (paperflow.dualreform.writer); the scripts only pass paths and params;
the smoke scale's preferences and metrics (`pipeline`, `retrieval`) are reused here unchanged.

Methods: `raw` (the question as is), `prompted` (the pretrained instruct model's greedy rewrite, zero-shot: the
LLM-based baseline, and the model every trained method starts from and samples the candidates with), `retpo` (gold
references: the upper bound), `dualreform` (responses refined by the CQR model itself, greedily: iteration 1 by the
pretrained model, iteration i by the model of iteration i - 1), `single_role` (responses + the current question,
no model) and `random_ref` (the control).
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

from paperflow.core.config import ConfigError
from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.core.resume import EVERY_S
from paperflow.dualreform import pipeline
from paperflow.dualreform import topiocqa as tq
from paperflow.dualreform.settings import TRAINED

log = logging.getLogger(__name__)
SLUG = "dualreform"
LIST_COLUMNS = ("hist_queries", "hist_responses")


def _fetch(ref: Mapping[str, Any], key: str, cache: str, patterns: list[str]) -> tuple[Path, str]:
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    revision = pinned_revision(ref["hub"], ref["revision"], slug=SLUG, key=key, repo_type=ref["repo_type"])
    folder = snapshot_folder(cache, ref["repo_type"], ref["hub"], revision)
    download_pretrained(ref["hub"], revision, folder, allow_patterns=patterns, repo_type=ref["repo_type"])
    return folder, revision


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
    passages: str,
    turns: str,
    bm25: Mapping[str, Any],
    threads: int,
    out: str,
    index_out: str | Path,
    checkpoint: str | Path | None = None,
) -> pd.DataFrame:
    """The bm25s index of the corpus into the folder `index_out` (an output: train and evaluate load it; its
    tq.INDEX_DONE marker written last) and the turns table `out` with each raw response's top passage and the
    single-role refiner's (tq.reference_table). No candidate is made here: the CQR model writes them (train).
    `checkpoint` (the job's checkpoint folder): the index is saved there once built and loaded by a rerun, then copied
    to `index_out`, and the responses' retrieval is journalled in batches of turns, a rerun retrieving only the
    batches left (None: no checkpoint; the index is built straight into `index_out`)."""
    from paperflow.core.resume import row_journal

    pas, _ = read_frame(passages)
    tur, _ = read_frame(turns)
    tur = _lists(tur, ("hist_queries", "hist_responses"))
    folder = Path(checkpoint) if checkpoint is not None else None
    saved = folder / "bm25" if folder is not None else Path(index_out)
    index = tq.CorpusBM25(pas["text"].tolist(), bm25["k1"], bm25["b"], threads=threads, folder=saved)
    if folder is None:
        table = tq.reference_table(tur, index)
    else:
        with row_journal(folder / "references.jsonl", key="start") as journal:
            table = tq.reference_table(tur, index, journal=journal)
        tq.CorpusBM25.publish(saved, index_out)
    write_frame(out, table, {"bm25": dict(bm25), "n_passages": len(pas)})
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
    return _lists(frame, LIST_COLUMNS), meta


def _tokenizer(pretrained_json: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        json.loads(Path(pretrained_json).read_text())["folder"], local_files_only=True
    )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


QUANTIZATION = (None, "4bit")


def _model(pretrained_json: str, pretrained: Mapping[str, Any], device):
    """The pretrained model on `device`, in eval mode: as stored (`pretrained.quantization` null) or in 4 bits for
    QLoRA ("4bit": bitsandbytes NF4 with double quantisation, computing in `pretrained.dtype`; a CUDA device only)."""
    import torch

    from paperflow.core.lm.models import load_pretrained

    info = json.loads(Path(pretrained_json).read_text())
    quant = pretrained["quantization"]
    if quant not in QUANTIZATION:
        raise ConfigError(f"pretrained.quantization {quant!r} is not supported; allowed values: null, 4bit")
    if quant is None:
        return load_pretrained(
            info["hub"], info["revision"], info["folder"], dtype=pretrained["dtype"], device=device
        ).eval()
    if torch.device(device).type != "cuda":
        raise ConfigError(
            f"pretrained.quantization 4bit needs a CUDA device (bitsandbytes' 4-bit layers); pretrained.device gave "
            f"{device}"
        )
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from paperflow.core.lm.models import require_pinned

    require_pinned(info["hub"], info["revision"])
    dtype = getattr(torch, pretrained["dtype"])
    config = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
    )
    index = torch.device(device).index
    return AutoModelForCausalLM.from_pretrained(
        info["folder"],
        local_files_only=True,
        dtype=dtype,
        quantization_config=config,
        device_map={"": 0 if index is None else index},
    ).eval()


def _pretrained(pretrained_json: str, pretrained: Mapping[str, Any], device):
    """(the pretrained model on `device` in eval mode, its tokenizer with a pad token)."""
    return _model(pretrained_json, pretrained, device), _tokenizer(pretrained_json)


SAMPLE_BATCH = 256  # training turns per journalled sampling batch


def _batch_size(pretrained: Mapping[str, Any]) -> int:
    """Prompts per generation batch: `pretrained.score_batch_size` (each decoded `generation.k` times to sample)."""
    return int(pretrained["score_batch_size"])


def open_index(index: str | Path, threads: int = 1) -> tq.CorpusBM25:
    """preprocess's saved BM25 index, given its folder or its tq.INDEX_DONE marker (the rules' input)."""
    path = Path(index)
    return tq.CorpusBM25.open(path.parent if path.name == tq.INDEX_DONE else path, threads)


def sample_pool(model, tok, prompts, index: tq.CorpusBM25, generation, seed: int, batch_size: int, journal):
    """The candidates the model samples for each training query (writer.sample_candidates: up to `generation.k`
    distinct whole rewrites, empty ones dropped) and the top-DEPTH BM25 ranking of each: (candidate lists, ranking
    arrays [k_i, DEPTH]), as pipeline.sample_pool gives at smoke scale. Sampled in batches of SAMPLE_BATCH turns,
    batch s seeded by writer.turn_seed(seed, s) (so a batch's samples do not depend on which batches ran before), each
    batch's candidates and rankings a row of `journal` (a RowJournal keyed by "start"): a rerun samples only the
    batches it lacks."""
    from paperflow.dualreform import writer

    gen = pipeline.check_generation(generation)
    n, size = len(prompts), max(1, int(SAMPLE_BATCH))
    starts = list(range(0, n, size))
    for s in journal.todo(starts, key=lambda start: start):
        e = min(s + size, n)
        cands = writer.sample_candidates(
            model,
            tok,
            prompts[s:e],
            k=int(gen["k"]),
            temperature=float(gen["temperature"]),
            top_k=gen["top_k"],
            max_new_tokens=int(gen["max_new_tokens"]),
            seed=writer.turn_seed(seed, s),
            batch_size=batch_size,
        )
        flat = [c for cs in cands for c in cs]
        top = index.top(flat, pipeline.DEPTH) if flat else np.zeros((0, 0), dtype=np.int64)  # [sum k_i, DEPTH]
        journal.append({"start": s, "stop": e, "cands": cands, "top": top.tolist()})
    rows = journal.complete(starts)
    depth = min(pipeline.DEPTH, index.n_docs)
    cands, tops = [], []
    for s, row in zip(starts, rows):
        if row["stop"] != min(s + size, n):
            raise ValueError(f"{journal.path}: batch {s} ends at {row['stop']}, not {min(s + size, n)}")
        top = np.asarray(row["top"], dtype=np.int64).reshape(-1, depth)
        bounds = np.cumsum([0, *(len(cs) for cs in row["cands"])])
        cands += row["cands"]
        tops += [top[bounds[i] : bounds[i + 1]] for i in range(len(row["cands"]))]
    return cands, tops


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

    def save(self, it: int, stage: str, refs=None, adapters=None, lora_cfg=None, history=None, refined=None) -> None:
        import torch

        from paperflow.core.seeding import rng_states
        from paperflow.dualreform import lora

        if self.folder is None:
            return
        self.path(it, "").mkdir(parents=True, exist_ok=True)
        if refs is not None:
            np.save(self.path(it, "refs.npy"), np.asarray(refs))
        if refined is not None:
            self.path(it, "refined.json").write_text(json.dumps(list(refined)))
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
            out["refined"] = json.loads(self.path(it, "refined.json").read_text())
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
    index_path: str | Path,
    pretrained_json: str,
    cfg: Mapping[str, Any],
    outputs: Mapping[str, Any],
    checkpoint: str | Path | None = None,
    every_s: float = EVERY_S,
    threads: int = 1,
) -> pd.DataFrame:
    """`method`'s rounds for one seed, as pipeline.train_method at smoke scale: the pretrained model samples
    `generation.k` candidate rewrites per training query once (the same for every method and round), each ranked by
    BM25 over the corpus (preprocess's index at `index_path`); each round, from the pretrained model: references
    (dualreform: BM25's top passage for the latest model's greedy refinement of the response; single_role: the
    response with its question; retpo: gold; random_ref: random), each candidate scored by its reference's rank
    (pipeline.reference_ranks), SFT on the best candidate and DPO on (best, a strictly worse one) of each turn with
    a preference (pipeline.preferences). Writes each round's adapters (outputs["checkpoints"][i - 1]), the training
    history and the references; returns the history.

    `checkpoint` (the job's checkpoint folder; README, "Long jobs resume"): the sampling is journalled in batches of
    turns (samples.jsonl), each round's references, SFT adapter and DPO round are kept there as they finish, and
    TRL's trainers save there at least every `every_s` seconds; a rerun with the same folder loads what finished and
    resumes the rest, ending where an uninterrupted run ends. None: no checkpoints."""
    from paperflow.core.device import pick
    from paperflow.core.resume import row_journal
    from paperflow.core.seeding import seed_all
    from paperflow.dualreform import lora, writer

    if method not in TRAINED:
        raise ValueError(f"method {method!r} is not trained; trained methods: {list(TRAINED)}")
    gen = pipeline.check_generation(cfg["generation"])
    device = pick(cfg["pretrained"]["device"], key="pretrained.device")
    table, meta = read_table(table_path)
    train_turns = table[table["split"] == "train"].reset_index(drop=True)
    gold = train_turns["gold_pid"].to_numpy()
    n_iter = int(cfg["iterations"]) if method == "dualreform" else 1
    if len(outputs["checkpoints"]) != n_iter:
        raise ValueError(f"{method}: {n_iter} rounds but {len(outputs['checkpoints'])} checkpoint paths")
    stages = _Stages(checkpoint)
    timed = every_s if checkpoint is not None else None
    histories, ref_rows = [], []
    seed_all(seed)
    tok = _tokenizer(pretrained_json)
    index = open_index(index_path, threads)
    prompts = lora.rewrite_prompts(tok, train_turns)
    batch_size = _batch_size(cfg["pretrained"])
    refiner = None  # dualreform: the model that refines the responses (the pretrained one, then the latest round's)

    def pretrained_model():
        return _model(pretrained_json, cfg["pretrained"], device)

    def saved_model(path: Path):  # a stage finished by an earlier run: its adapters on the pretrained model
        return stages.quiet(lambda: lora.apply_round(pretrained_model(), path))

    journal = None if checkpoint is None else Path(checkpoint) / "samples.jsonl"
    with row_journal(journal, key="start") as rows:
        if rows.todo(range(0, len(prompts), max(1, int(SAMPLE_BATCH))), key=lambda start: start):
            refiner = pretrained_model()
        cands, tops = sample_pool(refiner, tok, prompts, index, gen, seed, batch_size, rows)
    if method != "dualreform":
        refiner = None  # only the dual role writes with it again
    for it in range(1, n_iter + 1):
        refined = [""] * len(train_turns)
        if stages.done(it, "refs"):
            done = stages.load(it, "refs")
            refs, refined = done["refs"], done["refined"]
        else:
            if method == "dualreform":  # the dual role: the latest model writes the refined response
                if refiner is None and it == 1:
                    refiner = pretrained_model()
                elif refiner is None:  # the previous round finished in an earlier run
                    refiner = saved_model(stages.path(it - 1, "dpo.safetensors")).eval()
                refined = writer.greedy(
                    refiner,
                    tok,
                    lora.refine_prompts(tok, train_turns),
                    max_new_tokens=int(gen["max_new_tokens"]),
                    batch_size=batch_size,
                )
                refs = index.top(refined, 1)[:, 0]
            elif method == "single_role":
                refs = train_turns["r_single_top1"].to_numpy()
            else:
                refs = pipeline.pseudo_references(
                    method, train_turns, int(meta["n_passages"]), np.random.default_rng([seed, 2])
                )
            stages.save(it, "refs", refs=refs, refined=refined)
        ref_rows.append(
            pd.DataFrame(
                {
                    "iteration": it,
                    "turn_index": np.arange(len(train_turns)),
                    "ref": refs,
                    "gold": gold,
                    "refined": refined,
                }
            )
        )
        best, worse = pipeline.preferences(pipeline.reference_ranks(tops, refs), np.random.default_rng([seed, 1]))
        pairs = [i for i in range(len(train_turns)) if worse[i] >= 0]
        if not pairs:
            raise ValueError(f"{method} iteration {it}: every candidate ties on every turn; no preference pair")
        chosen = [cands[i][best[i]] for i in pairs]
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
                [prompts[i] for i in pairs],
                chosen,
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
                chosen,
                [cands[i][worse[i]] for i in pairs],
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
            h_sft.assign(phase=f"{method} it{it} sft", n_pairs=len(pairs)),
            h_dpo.assign(phase=f"{method} it{it} dpo", n_pairs=len(pairs)),
        ]
        for h in histories[-2:]:
            h["iteration"] = it
        refiner = model.eval() if model is not None else None
    history = pd.concat(histories, ignore_index=True).assign(seed=seed, method=method)
    history.to_csv(outputs["history"], index=False)
    n_cands = [len(c) for c in cands]
    meta_out = {"method": method, "generation": gen, "candidates_per_turn_mean": float(np.mean(n_cands))}
    write_frame(outputs["refs"], pd.concat(ref_rows, ignore_index=True).assign(seed=seed), meta_out)
    return history


def evaluate(
    method: str,
    seed: int,
    table_path: str,
    index_path: str | Path,
    pretrained_json: str | None,
    checkpoints: Mapping[int, str],
    pretrained: Mapping[str, Any] | None,
    generation: Mapping[str, Any] | None,
    dense: Mapping[str, Any] | None = None,
    journal: str | Path | None = None,
    threads: int = 1,
) -> pd.DataFrame:
    """Test-turn retrieval of a method per iteration (`raw`: the question; `prompted`: the pretrained model's greedy
    rewrite; a trained method: each round's model's greedy rewrite, writer.greedy with `generation.max_new_tokens`):
    MRR, nDCG@3, R@10, R@100 under BM25 (preprocess's index at `index_path`) and the share of rewrites equal to the
    question (`share_unchanged`); with `dense` ({"json", "index", "settings"}), the same metrics of the dense
    retriever, prefixed "dense_", for the same rewrites. `journal` (a file in the job's checkpoint folder): each
    iteration's row is kept there as it finishes and a rerun evaluates only the iterations it lacks (None: a scratch
    journal)."""
    from paperflow.core.resume import row_journal

    table, _ = read_table(table_path)
    test = table[table["split"] == "test"].reset_index(drop=True)
    index = open_index(index_path, threads)
    runs: dict[int, str | None] = {0: None} if method in ("raw", "prompted") else dict(checkpoints)
    with row_journal(journal, key="iteration") as rows:
        for it, path in rows.todo(sorted(runs.items()), key=lambda run: run[0]):
            row = _evaluate_iteration(
                method, seed, test, index, it, path, pretrained_json, pretrained, generation, dense
            )
            rows.append({"iteration": it, "row": list(row.items())})  # pairs: the columns keep their order
        return pd.DataFrame([dict(r["row"]) for r in rows.complete(sorted(runs))])


def rewrite_test(test: pd.DataFrame, model, tok, generation: Mapping[str, Any], batch_size: int) -> list[str]:
    """The model's greedy rewrite of each test question (its chat prompt, lora.rewrite_prompts)."""
    from paperflow.dualreform import lora, writer

    gen = pipeline.check_generation(generation)
    return writer.greedy(
        model, tok, lora.rewrite_prompts(tok, test), max_new_tokens=int(gen["max_new_tokens"]), batch_size=batch_size
    )


def _evaluate_iteration(
    method, seed, test, index, it, path, pretrained_json, pretrained, generation, dense
) -> dict[str, Any]:
    """One iteration's row of `evaluate`."""
    from paperflow.dualreform.retrieval import retrieval_metrics

    if method == "raw":
        rewrites = list(test["query"])
    else:
        from paperflow.core.device import pick
        from paperflow.dualreform import lora

        device = pick(pretrained["device"], key="pretrained.device")
        model, tok = _pretrained(pretrained_json, pretrained, device)
        if path is not None:
            model = lora.apply_round(model, path).eval()
        rewrites = rewrite_test(test, model, tok, generation, _batch_size(pretrained))
        del model
    gold = test["gold_pid"].to_numpy()
    top = index.top(rewrites, pipeline.DEPTH)
    ranks = np.concatenate(pipeline.reference_ranks([t[None, :] for t in top], gold))
    row = {"method": method, "seed": seed, "iteration": it, **retrieval_metrics(ranks)}
    if dense is not None:
        row |= {f"dense_{k}": v for k, v in _dense_metrics(test, rewrites, dense).items()}
    row["share_unchanged"] = float(np.mean([r == q for r, q in zip(rewrites, test["query"])]))
    return row


def _dense_metrics(test: pd.DataFrame, rewrites: list[str], dense: Mapping[str, Any]) -> dict[str, float]:
    from paperflow.core.device import pick
    from paperflow.dualreform import dense as dn
    from paperflow.dualreform.retrieval import retrieval_metrics

    settings = dense["settings"]
    device = pick(settings["device"], key="dense.device")
    encoder = dn.encoder(dense["json"], settings, device)
    vectors = dn.encode(encoder, rewrites, int(settings["batch_size"]))
    tops = dn.top(dense["index"], vectors, pipeline.DEPTH, device)
    return retrieval_metrics(dn.gold_ranks(tops, test["gold_pid"].to_numpy()))
