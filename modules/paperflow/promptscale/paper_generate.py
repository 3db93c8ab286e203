"""PromptScale's paper-scale generation stages, one function per rule, each talking to a vLLM server
(`vllm_server.served`, on the kit's paperflow.core.lm.serve; the rules run in envs/lm-serve.yaml, so this module uses
the standard library only):

sample_rationales   the E-step's K rationales per seed from q_m (training seeds while m < E; the held-out seeds always)
synthesize          new (rationale, problem) pairs from p on held-out concept sets: validity, distinctness, length
evaluate_benchmark  the policy's samples on a math benchmark, boxed-answer exact match, avg@k (spec 8)

Each takes `journal`, a file in the job's checkpoint folder (the rules pass `job.checkpoint_dir() / "rows.jsonl"`):
every prompt's samples are journalled as they finish and a rerun asks only for the rest (vllm_server.complete_each),
writing what an uninterrupted run writes. Without it (None) nothing is journalled.
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.promptscale import llm_text as lt
from paperflow.promptscale.vllm_server import chat_each, complete_each, journal_at, served

log = logging.getLogger(__name__)


def sample_rationales(
    q_folder: str,
    train: str,
    heldout: str,
    iteration: int,
    em: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, int]:
    """K rationales per seed from q_`iteration` at T = `llm_em.temperature` (stopped at the end marker): the training
    seeds while `iteration` < E (the next M-step needs them) and the held-out seeds always (the bound of iteration
    m). Rows: {"split", "index", "rationales": [K texts]}. Returns the rows per split. `journal`: module docstring."""
    splits = {"heldout": lt.read_jsonl(heldout)}
    if iteration < int(em["iterations"]):
        splits["train"] = lt.read_jsonl(train)
    k = int(em["k"])
    rows = []
    with journal_at(journal) as done, served(q_folder, f"q{iteration}", vllm, server_log, dtype) as client:
        for split, triples in splits.items():
            prompts = [lt.q_prompt(t["concepts"], t["difficulty"], t["problem"]) for t in triples]
            samples = complete_each(
                client,
                prompts,
                n=k,
                temperature=float(em["temperature"]),
                top_p=float(em["top_p"]),
                max_tokens=int(em["max_rationale_tokens"]),
                seed=1_000_003 * iteration + (0 if split == "train" else 500_000),
                stop=[lt.RATIONALE[1]],
                journal=done,
                tag=f"{split}:",
            )
            for i, choices in enumerate(samples):
                texts = [lt.rationale_of_sample(c["text"]) or "" for c in choices]
                rows.append({"split": split, "index": i, "rationales": texts})
    lt.write_jsonl(out, rows)
    return {s: sum(r["split"] == s for r in rows) for s in splits}


def concept_sets(heldout: Sequence[Mapping[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    """`n` (concepts, difficulty, domain) drawn uniformly with replacement from the held-out seeds of every domain
    (so each domain's share follows its held-out size; the 1.0 concept sampler, with its Llama-3.1-8B embeddings
    and faiss index, is not wired: README). A row without a domain is math (PromptCoT 1.0's)."""
    rng = random.Random(seed)
    return [
        {"concepts": t["concepts"], "difficulty": t["difficulty"], "domain": t.get("domain", "math")}
        for t in (heldout[rng.randrange(len(heldout))] for _ in range(n))
    ]


def synthesize(
    p_folder: str,
    heldout: str,
    variant: str,
    synthesis: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """`synthesis.n` problems from p on held-out concept sets; rows {"concepts", "difficulty", "domain", "text",
    "rationale", "problem", "valid", "finish_reason"} (the domain of the seed the concept set came from). Returns
    the summary: validity (both spans written), the share of distinct problems among the valid ones, their mean
    length in words, the share cut at max_tokens; with more than one domain also `by_domain` (rows, validity).
    `journal`: module docstring."""
    sets = concept_sets(lt.read_jsonl(heldout), int(synthesis["n"]), int(synthesis["seed"]))
    with journal_at(journal) as done, served(p_folder, f"p_{variant}", vllm, server_log, dtype) as client:
        samples = complete_each(
            client,
            [lt.p_prompt(s["concepts"], s["difficulty"]) for s in sets],
            n=1,
            temperature=float(synthesis["temperature"]),
            top_p=float(synthesis["top_p"]),
            max_tokens=int(synthesis["max_tokens"]),
            seed=int(synthesis["seed"]),
            journal=done,
        )
    rows = []
    for s, (choice,) in zip(sets, samples):
        rows.append(
            {**s, "text": choice["text"], "finish_reason": choice["finish_reason"]} | lt.parse_synthesis(choice["text"])
        )
    lt.write_jsonl(out, rows)
    valid = [r["problem"] for r in rows if r["valid"]]
    summary = {
        "variant": variant,
        "n": len(rows),
        "validity": len(valid) / len(rows),
        "distinct_problems": len(set(valid)) / len(valid) if valid else 0.0,
        "mean_problem_words": statistics.fmean(len(x.split()) for x in valid) if valid else 0.0,
        "truncated": sum(r["finish_reason"] == "length" for r in rows) / len(rows),
    }
    domains = sorted({r["domain"] for r in rows})
    if len(domains) > 1:
        summary["by_domain"] = {
            d: {"n": len(of), "validity": sum(r["valid"] for r in of) / len(of)}
            for d in domains
            for of in [[r for r in rows if r["domain"] == d]]
        }
    return summary


def evaluate_benchmark(
    policy_folder: str,
    policy: str,
    benchmark_rows: str,
    benchmark: str,
    settings: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """`llm_eval.samples` answers per problem from the policy (its chat template), each checked by boxed-answer
    exact match; rows {"id", "answer", "correct": [bools], "boxed": [answers]}. Returns avg@k accuracy (percent, the
    tables' unit) and the share of answers cut at max_tokens. `journal`: module docstring."""
    rows = lt.read_jsonl(benchmark_rows)
    k = int(settings["samples"])
    with journal_at(journal) as done, served(policy_folder, policy, vllm, server_log, dtype) as client:
        samples = chat_each(
            client,
            [lt.eval_prompt(r["problem"]) for r in rows],
            n=k,
            temperature=float(settings["temperature"]),
            top_p=float(settings["top_p"]),
            top_k=int(settings.get("top_k", -1)),
            max_tokens=int(settings["max_tokens"]),
            seed=int(settings["seed"]),
            journal=done,
        )
    graded = []
    for r, choices in zip(rows, samples):
        graded.append(
            {
                "id": r["id"],
                "answer": r["answer"],
                "correct": [lt.answer_matches(c["text"], r["answer"]) for c in choices],
                "boxed": [lt.last_boxed(c["text"]) for c in choices],
                "truncated": [c["finish_reason"] == "length" for c in choices],
            }
        )
    lt.write_jsonl(out, graded)
    per_problem = [sum(g["correct"]) / k for g in graded]
    return {
        "policy": policy,
        "benchmark": benchmark,
        "problems": len(graded),
        "samples": k,
        "avg_at_k": 100.0 * statistics.fmean(per_problem),
        "truncated": statistics.fmean(sum(g["truncated"]) / k for g in graded),
    }
