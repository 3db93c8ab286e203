"""PromptScale at paper scale (`source.kind: official`), the stages that run in envs/lm.yaml, one function per rule:

download_corpus   the seed corpus (PromptCoT 1.0's triples) or a benchmark at its pinned commit, as JSONL rows
preprocess        held-out and training seeds per domain (math; code with the annotate jobs' triples), deduplicated
                  by problem, shuffled by `seeds_data.seed`, each row tagged with its "domain"
fine_tune         q_m or p_m: TRL SFT from q_{m-1} / p_{m-1} (the pretrained model at m = 0) on the cold-start
                  triples (m = 0) or the E-step's kept rationales, on the node's GPUs (paperflow.promptscale.sft)
score_estep       log p_m(z, x | c) and log q_m(z | c, x) of every sampled rationale (transformers, teacher forcing
                  on the token layout TRL trains on), best-of-K selection for the next M-step, the held-out bound

The vLLM stages are in `paper_generate`, the report in `paper_report`; the models of `models` and the annotators
are downloaded by the shared stage (paperflow.core.hub_download, rules/common.smk's hub_model_stage).
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.core.hub import snapshot_folder
from paperflow.promptscale import llm_text as lt

log = logging.getLogger(__name__)
SLUG = "promptscale"


def download_corpus(name: str, spec: Mapping[str, Any], cache: str, out: str) -> dict[str, Any]:
    """Corpus `name` (`corpora.<name>`) at its pinned commit, only the files `spec.files` fetched, written to `out`
    as JSONL: the seed triples {"concepts", "difficulty", "rationale", "problem"} (format promptcot_triples; rows
    that do not parse are dropped and counted), math benchmark rows {"id", "problem", "answer"}, or LiveCodeBench
    problems with their tests (format livecodebench: paperflow.promptscale.code_eval)."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained
    from paperflow.promptscale.annotate import STATEMENT_FORMATS
    from paperflow.promptscale.codeforces import FORMATS as CODEELO_FORMATS

    hub, fmt = spec["hub"], spec["format"]
    if fmt not in (*lt.FORMATS, *STATEMENT_FORMATS, *CODEELO_FORMATS):
        raise ValueError(
            f"corpora.{name}.format = {fmt!r}: allowed {(*lt.FORMATS, *STATEMENT_FORMATS, *CODEELO_FORMATS)}"
        )
    revision = pinned_revision(hub, spec["revision"], slug=SLUG, key=f"corpora.{name}.revision", repo_type="dataset")
    folder = snapshot_folder(cache, "dataset", hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=list(spec["files"]), repo_type="dataset")
    if fmt in lt.CODE_FORMATS:  # streamed (the release files are GBs), kept by contest date, tests decoded
        from paperflow.promptscale.code_eval import download_lcb

        return {"hub": hub, "revision": revision, **download_lcb(name, spec, folder, out)}
    if fmt in STATEMENT_FORMATS:  # Codeforces statements, the code seeds' (paperflow.promptscale.annotate)
        from paperflow.promptscale.annotate import download_statements

        return {"hub": hub, "revision": revision, **download_statements(name, spec, folder, out)}
    if fmt in CODEELO_FORMATS:  # CodeElo's contest problems (paperflow.promptscale.codeforces)
        from paperflow.promptscale.codeforces import download_codeelo

        return {"hub": hub, "revision": revision, **download_codeelo(name, spec, folder, out)}
    if fmt in lt.SFT_FORMATS:  # streamed: millions of long traces
        from paperflow.promptscale.sft_arm import download_traces

        return {"hub": hub, "revision": revision, **download_traces(name, spec, folder, out)}
    records = lt.read_snapshot_records(folder, spec["files"])
    if fmt == "promptcot_triples":
        missing = {"prompt", "completion"} - set(records[0]) if records else {"prompt", "completion"}
        if missing:
            raise ValueError(f"corpora.{name}: {hub} rows lack {sorted(missing)} (format promptcot_triples)")
        rows = [t for t in (lt.parse_triple(str(r["prompt"]), str(r["completion"])) for r in records) if t]
        if not rows:
            raise ValueError(f"corpora.{name}: none of the {len(records)} rows of {hub} parses as a triple")
    else:
        rows = lt.benchmark_rows(records, fmt, name)
    lt.write_jsonl(out, rows)
    return {"hub": hub, "revision": revision, "records": len(records), "rows": len(rows)}


def _split_domain(
    triples: list[dict[str, Any]], domain: str, n_heldout: int, n_train: int | None, seed: int, key: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(held-out, train, distinct) of one domain's triples: deduplicated by problem text, shuffled by `seed`, the
    first `n_heldout` held out, the next `n_train` (None: all that remain) for training; each row tagged `domain`."""
    seen, unique = set(), []
    for t in triples:
        text = " ".join(t["problem"].split())
        if text not in seen:
            seen.add(text)
            unique.append({**t, "domain": domain})
    random.Random(seed).shuffle(unique)
    if len(unique) <= n_heldout:
        raise ValueError(f"{key}.n_heldout = {n_heldout} leaves no training seed of {len(unique)} distinct ones")
    end = None if n_train is None else n_heldout + n_train
    return unique[:n_heldout], unique[n_heldout:end], len(unique)


def preprocess(
    seeds: str, settings: Mapping[str, Any], out_train: str, out_heldout: str, code: Sequence[str] = ()
) -> dict[str, int]:
    """The seed triples deduplicated by problem text, shuffled by `seeds_data.seed`; the first `n_heldout` are the
    held-out seeds (never trained on), the next `n_train` (or all that remain) the training seeds. Every row
    carries its "domain": the PromptCoT 1.0 triples are math; with `code` (the annotate jobs' triples, when
    `seeds_data.domains` has code) the code triples are split the same way by `seeds_data.code` and follow the
    math rows in both files (math first, so the math rows are those of a math-only run)."""
    triples = lt.read_jsonl(seeds)
    seed = int(settings["seed"])
    heldout, train, distinct = _split_domain(
        triples, "math", int(settings["n_heldout"]), int(settings["n_train"]), seed, "seeds_data"
    )
    counts = {"seeds": len(triples), "distinct": distinct, "train": len(train), "heldout": len(heldout)}
    if "code" in settings.get("domains", ["math"]):
        sizes = settings["code"]
        code_triples = [t for path in code for t in lt.read_jsonl(path)]
        n_train = None if sizes.get("n_train") is None else int(sizes["n_train"])
        code_heldout, code_train, code_distinct = _split_domain(
            code_triples, "code", int(sizes["n_heldout"]), n_train, seed, "seeds_data.code"
        )
        heldout, train = heldout + code_heldout, train + code_train
        counts |= {
            "code_seeds": len(code_triples),
            "code_distinct": code_distinct,
            "code_train": len(code_train),
            "code_heldout": len(code_heldout),
        }
    lt.write_jsonl(out_heldout, heldout)
    lt.write_jsonl(out_train, train)
    return counts


def fine_tune(
    which: str,
    iteration: int,
    start: str,
    train: str,
    kept: str | None,
    settings: Mapping[str, Any],
    device: str,
    n_procs: int,
    out_folder: str,
    history: str,
    checkpoint_dir: str | None = None,
) -> dict[str, Any]:
    """q_`iteration` or p_`iteration` (`which`): TRL SFT of the model at `start` on (c, x) -> z (q) or c -> (z, x)
    (p), with z the cold-start rationale at iteration 0 and the E-step's kept one after. Returns the last logged
    training loss and the number of rows. `checkpoint_dir`: the job's checkpoint folder (TRL's checkpoints, resumed
    from on a rerun: paperflow.promptscale.sft)."""
    from paperflow.promptscale.sft import run_sft

    if which not in ("q", "p"):
        raise ValueError(f"model {which!r}: q or p")
    triples = lt.read_jsonl(train)
    if iteration > 0:
        if kept is None:
            raise ValueError(f"iteration {iteration} fine-tunes on the E-step's kept rationales; none given")
        chosen = {r["index"]: r["rationale"] for r in lt.read_jsonl(kept)}
        triples = [{**t, "rationale": chosen[i]} for i, t in enumerate(triples) if chosen.get(i)]
    pairs = (lt.pairs_q if which == "q" else lt.pairs_p)(triples)
    out = Path(out_folder)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = out.parent / f"{out.name}.sft.jsonl"
    lt.write_jsonl(data, pairs)
    try:
        logged = run_sft(start, str(data), str(out), settings, device, n_procs, history, checkpoint_dir)
    finally:
        data.unlink(missing_ok=True)
    losses = [r["loss"] for r in logged if "loss" in r]
    return {"model": f"{which}{iteration}", "rows": len(pairs), "final_loss": losses[-1] if losses else None}


def fine_tune_job(
    which: str,
    iteration: int,
    inputs: Mapping[str, str],
    settings: Mapping[str, Any],
    device: str,
    n_procs: int,
    out_json: str,
    history: str,
    checkpoint_dir: str | None = None,
) -> dict[str, Any]:
    """The train rule: `fine_tune` from the model its `start` input names, into the folder beside `out_json`
    (results/.../models/q1/ for models/q1.json), and `out_json` naming that folder and its files. `checkpoint_dir`:
    the job's checkpoint folder (`fine_tune`)."""
    folder = Path(out_json).with_suffix("")
    summary = fine_tune(
        which,
        iteration,
        lt.model_folder(inputs["start"]),
        inputs["train"],
        inputs.get("kept"),
        settings,
        device,
        n_procs,
        str(folder),
        history,
        checkpoint_dir,
    )
    lt.write_model_json(out_json, summary["model"], folder)
    return summary


def trl_layout(tok, prompt: str, completion: str) -> tuple[list[int], int]:
    """(token ids, index of the first completion token) of a prompt-completion pair as TRL 1.16's SFTTrainer lays it
    out: tok(prompt + completion + eos), the completion starting where tok(prompt) stops being its prefix."""
    head = tok(prompt)["input_ids"]
    full = tok(prompt + completion + tok.eos_token)["input_ids"]
    start = next((i for i, (a, b) in enumerate(zip(head, full)) if a != b), min(len(head), len(full)))
    return full, start


def completion_logprobs(
    model, tok, prompts: Sequence[str], completions: Sequence[str], batch_size: int, device, journal=None, tag=""
) -> list[float]:
    """log model(completion + EOS | prompt) of each pair, summed over the completion's tokens, on the token layout
    TRL's SFTTrainer trains on: tok(prompt + completion + eos) with the completion starting where tok(prompt)
    stops being its prefix. With `journal` (a RowJournal) batch b's values are its row `tag` + b there: the batches
    journalled are not scored again (the batches are the same on a rerun, so are their values)."""
    import torch

    from paperflow.core.lm.sampling import sequence_logprobs

    rows = [trl_layout(tok, prompt, completion) for prompt, completion in zip(prompts, completions)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = []
    with torch.no_grad():
        for b in range(0, len(rows), batch_size):
            if journal is not None and f"{tag}{b}" in journal:
                out += journal.complete([f"{tag}{b}"])[0]["logprobs"]
                continue
            chunk = rows[b : b + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            completion = torch.zeros((len(chunk), width), dtype=torch.bool)
            for r, (seq, start) in enumerate(chunk):
                left = width - len(seq)  # left padding, as the kit's sampler expects
                ids[r, left:] = torch.tensor(seq)
                mask[r, left:] = 1
                completion[r, left + start :] = True
            logp = sequence_logprobs(model, ids.to(device), mask.to(device)).float().cpu()
            values = (logp * completion).sum(1).double().tolist()
            if journal is not None:
                journal.append({"id": f"{tag}{b}", "logprobs": values})
            out += values
    return out


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values)) if math.isfinite(top) else top


def select_kept(
    rows: Sequence[Mapping[str, Any]],
    rewards: Sequence[float],
    log_q: Sequence[float],
    em: Mapping[str, Any],
    iteration: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The E-step's choice and measures from the scores of every sample (rows' samples flattened in order):
    per training seed the kept rationale (the argmax of R for `select` best, a uniform one of the K for random),
    per held-out seed the bound log (1/K) sum_k exp(R_k - log q_k). Returns (kept rows, the iteration's summary)."""
    rng = random.Random(1_000_003 * iteration + 7)
    kept, bounds, best, chosen = [], [], [], []
    at = 0
    for r in rows:
        k = len(r["rationales"])
        reward, logq = rewards[at : at + k], log_q[at : at + k]
        at += k
        if r["split"] == "heldout":
            bounds.append(_logsumexp([a - b for a, b in zip(reward, logq)]) - math.log(k))
            continue
        if em["select"] == "best":
            j = max(range(k), key=reward.__getitem__)
        elif em["select"] == "random":
            j = rng.randrange(k)
        else:
            raise ValueError(f"llm_em.select = {em['select']!r}: best or random")
        kept.append({"index": r["index"], "rationale": r["rationales"][j], "reward": reward[j]})
        best.append(max(reward))
        chosen.append(reward[j])
    summary = {
        "iteration": iteration,
        "select": em["select"],
        "k": int(em["k"]),
        "heldout_bound": sum(bounds) / len(bounds) if bounds else math.nan,
        "heldout_items": len(bounds),
        "kept_reward": sum(chosen) / len(chosen) if kept else None,
        "best_reward": sum(best) / len(best) if kept else None,
        "distinct_kept": len({r["rationale"] for r in kept}) / len(kept) if kept else None,
        "train_items": len(kept),
    }
    return kept, summary


def score_estep(
    iteration: int,
    p_folder: str,
    q_folder: str,
    train: str,
    heldout: str,
    samples: str,
    em: Mapping[str, Any],
    model_cfg: Mapping[str, Any],
    batch_size: int,
    out_kept: str | None,
    out_bound: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """For every sampled rationale z of seed (c, x): R = log p_m(z, x | c) and log q_m(z | c, x). Training seeds:
    the kept z* = argmax_k R (`llm_em.select` best) or a uniform one of the K (random: section 11's control), written
    to `out_kept` as {"index", "rationale", "reward"}. Held-out seeds: the importance-weighted bound
    log (1/K) sum_k exp(R_k - log q_k) averaged (nats per problem). Writes and returns the iteration's measures.
    With `journal` (a file in the job's checkpoint folder) each scored batch is journalled ("p:<b>", "q:<b>") and a
    rerun scores only the batches left (a model whose batches are all there is not loaded)."""
    import contextlib

    import torch

    from paperflow.core.device import pick
    from paperflow.core.resume import row_journal

    device = pick(model_cfg["device"], key="models.prompt.device")
    dtype = getattr(torch, model_cfg["dtype"])
    splits = {"train": lt.read_jsonl(train), "heldout": lt.read_jsonl(heldout)}
    rows = lt.read_jsonl(samples)
    items = [(r["split"], r["index"], z) for r in rows for z in r["rationales"]]
    scores = {}
    with contextlib.ExitStack() as stack:
        done = None if journal is None else stack.enter_context(row_journal(journal))
        for name, folder, template in (("p", p_folder, "p"), ("q", q_folder, "q")):
            batches = [f"{name}:{b}" for b in range(0, len(items), batch_size)]
            if done is not None and all(i in done for i in batches):
                scores[name] = [v for row in done.complete(batches) for v in row["logprobs"]]
                continue
            scores[name] = _score_model(folder, template, items, splits, dtype, device, batch_size, done, f"{name}:")
    kept, summary = select_kept(rows, scores["p"], scores["q"], em, iteration)
    if out_kept:
        lt.write_jsonl(out_kept, kept)
    Path(out_bound).parent.mkdir(parents=True, exist_ok=True)
    Path(out_bound).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _score_model(folder, template, items, splits, dtype, device, batch_size, journal, tag) -> list[float]:
    """score_estep's log-probabilities of every (split, index, z) under the model at `folder` (p's or q's layout)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=dtype).to(device).eval()
    prompts, completions = [], []
    for split, i, z in items:
        t = splits[split][i]
        if template == "p":
            prompts.append(lt.p_prompt(t["concepts"], t["difficulty"]))
            completions.append(lt.p_completion(z, t["problem"]))
        else:
            prompts.append(lt.q_prompt(t["concepts"], t["difficulty"], t["problem"]))
            completions.append(lt.q_completion(z))
    return completion_logprobs(model, tok, prompts, completions, batch_size, device, journal, tag)
