"""PromptScale's self-play arm at paper scale (spec 2.5; PromptCoT 2.0's README, self-play pipeline steps 2-4): the
policy's rollouts on the synthesised problems, their verification, and the chosen/rejected pairs that DPO trains on.
No third-party import but the config check's (jsonschema / yaml, both in envs/lm-serve.yaml): `rollouts` runs
beside the vLLM server.

rollouts      `selfplay.seeds` passes of `selfplay.completions_per_seed` chat completions per valid synthesised
              math problem (domain math; code problems: code_selfplay.py) at T = `selfplay.temperature` (the
              paper: 8 x 8 at 1.2), each pass with its own seeds
grade         the math verifier: a synthesised problem has no reference answer, so the reference is the majority
              of the rollouts' last boxed answers (the path PromptCoT 2.0's self_play_eval.py takes when a row has
              no answer), and a rollout passes when its boxed answer (after the reasoning) equals it
pairs         per problem, as PromptCoT 2.0's prepare_self_play_data.py builds them: drop problems that no rollout
              passes or that more than `max_pass_rate` (1/2) of them pass; the distinct well-formed passing rollouts
              are the chosen ones, the distinct well-formed failing ones the rejected ones; pair the i-th with the
              i-th, at most `max_pairs_per_problem` (upstream: 2 or 4 when the answer is a majority vote); shuffle.

Well-formed (`require_think`): the reasoning closed by one `</think>` with text before it, an answer after it with a
boxed value (Qwen3 thinking models get `<think>` from the chat template, so a completion holds no opening tag).
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from paperflow.promptscale import llm_text as lt

THINK_END = "</think>"
SETTINGS = (
    "source",
    "max_problems",
    "seeds",
    "completions_per_seed",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "seed",
    "max_pass_rate",
    "max_pairs_per_problem",
    "require_think",
)


def check_settings(settings: Mapping[str, Any], where: str = "selfplay") -> dict[str, Any]:
    from paperflow.core.config import reject_unknown, require_keys

    require_keys(settings, SETTINGS, where)
    reject_unknown(settings, SETTINGS, where)
    return dict(settings)


def after_think(text: str) -> str:
    """The answer part of a completion: what follows the last `</think>` (the whole text when there is none)."""
    return text.rsplit(THINK_END, 1)[-1]


def final_answer(text: str) -> str | None:
    """The normalised last boxed answer after the reasoning, None when there is none."""
    boxed = lt.last_boxed(after_think(text))
    return None if boxed is None or not lt.normalise_answer(boxed) else lt.normalise_answer(boxed)


def well_formed(text: str, require_think: bool) -> bool:
    """A completion DPO may learn from: with `require_think`, exactly one `</think>`, no `<think>` after the start,
    reasoning before it and an answer after it; always a boxed answer after the reasoning."""
    if require_think:
        if text.count(THINK_END) != 1 or "<think>" in text.split(THINK_END)[1]:
            return False
        reasoning, answer = text.split(THINK_END)
        if not reasoning.replace("<think>", "").strip() or not answer.strip():
            return False
    return final_answer(text) is not None


def majority_answer(completions: Sequence[str]) -> str | None:
    """The most frequent normalised final answer among the completions (the first seen among equals), None when
    no completion has one."""
    answers = [a for a in (final_answer(c) for c in completions) if a is not None]
    if not answers:
        return None
    counts = Counter(answers)
    top = max(counts.values())
    return next(a for a in answers if counts[a] == top)


def grade(completions: Sequence[str], reference: str | None = None) -> tuple[str | None, list[bool]]:
    """(reference, pass per completion): the given reference, else the majority answer of the completions."""
    ref = lt.normalise_answer(reference) if reference else majority_answer(completions)
    return ref, [ref is not None and final_answer(c) == ref for c in completions]


def problem_pairs(
    completions: Sequence[str], passed: Sequence[bool], settings: Mapping[str, Any], formed=None
) -> tuple[str, list[tuple[str, str]]]:
    """(status, [(chosen, rejected)]) of one problem's graded rollouts; status says why a problem gave no pair:
    "unsolved", "too_easy" (pass rate > max_pass_rate), "no_valid" (no well-formed chosen or rejected), "paired".
    `formed(text)` says which completions are well-formed (default: the math `well_formed`; code_selfplay's for
    programs)."""
    if not completions:
        return "unsolved", []
    rate = sum(passed) / len(completions)
    if rate == 0:
        return "unsolved", []
    if rate > float(settings["max_pass_rate"]):
        return "too_easy", []
    chosen, rejected = [], []
    for text, ok in zip(completions, passed):
        if not (formed(text) if formed else well_formed(text, bool(settings["require_think"]))):
            continue
        pool = chosen if ok else rejected
        if text not in pool:
            pool.append(text)
    n = min(int(settings["max_pairs_per_problem"]), len(chosen), len(rejected))
    if n == 0:
        return "no_valid", []
    return "paired", list(zip(chosen[:n], rejected[:n]))


PAIR_STATUSES = ("paired", "unsolved", "too_easy", "no_valid")  # why a problem did or did not give pairs


def collect_pairs(
    graded: Sequence[tuple[Mapping[str, Any], Sequence[str], Sequence[bool]]], settings: Mapping[str, Any], formed=None
) -> tuple[list, dict]:
    """The DPO pairs of graded problems, each given as (the fields its pair rows carry, its completions, which
    passed), shuffled with `selfplay.seed`: rows {**fields, "chosen", "rejected"}; and the summary (problems by
    status, pairs, the mean pass rate). Shared by the math pairs (build_pairs) and the code pairs (code_selfplay)."""
    pairs, statuses, rates = [], Counter(), []
    for fields, completions, passed in graded:
        rates.append(sum(passed) / len(passed) if passed else 0.0)
        status, chosen_rejected = problem_pairs(completions, passed, settings, formed=formed)
        statuses[status] += 1
        pairs += [{**fields, "chosen": chosen, "rejected": rejected} for chosen, rejected in chosen_rejected]
    random.Random(int(settings["seed"])).shuffle(pairs)
    summary = {
        "problems": len(graded),
        **{f"problems_{s}": statuses.get(s, 0) for s in PAIR_STATUSES},
        "pairs": len(pairs),
        "mean_pass_rate": statistics.fmean(rates) if rates else 0.0,
    }
    return pairs, summary


def build_pairs(rollout_rows: Sequence[Mapping[str, Any]], settings: Mapping[str, Any]) -> tuple[list, dict]:
    """The math DPO pairs of all problems (collect_pairs): rows {"id", "problem", "reference", "chosen", "rejected"},
    the reference being the rollouts' majority answer unless the row carries one."""
    graded = []
    for row in rollout_rows:
        reference, passed = grade(row["completions"], row.get("answer"))
        graded.append(
            ({"id": row["id"], "problem": row["problem"], "reference": reference}, row["completions"], passed)
        )
    return collect_pairs(graded, settings)


def pairs_job(rollouts_jsonl: str, settings: Mapping[str, Any], out: str) -> dict[str, Any]:
    """The pairs rule: `build_pairs` of a rollouts file into `out` (JSONL); the summary."""
    pairs, summary = build_pairs(lt.read_jsonl(rollouts_jsonl), check_settings(settings))
    if not pairs:
        raise ValueError(f"{rollouts_jsonl}: no DPO pair ({summary}); DPO needs at least one")
    lt.write_jsonl(out, pairs)
    return summary


def selfplay_problems(
    synth_rows: Sequence[Mapping[str, Any]], max_problems: int | None, domain: str = "math"
) -> list[dict[str, Any]]:
    """The distinct valid synthesised problems of `domain` (a row without "domain" is math) in file order, the first
    `max_problems` (all when null)."""
    seen, out = set(), []
    for i, row in enumerate(synth_rows):
        if row.get("valid") and row.get("domain", "math") == domain and row["problem"] not in seen:
            seen.add(row["problem"])
            out.append({"id": i, "problem": row["problem"]})
    return out if max_problems is None else out[: int(max_problems)]


def sample_passes(client, messages: Sequence[str], settings: Mapping[str, Any], journal=None) -> tuple[list, list]:
    """(texts, finish reasons) per message: `seeds` passes of `completions_per_seed` chat completions each, pass s
    giving message i the seed `seed + s * n_messages + i` (shared by the math and code rollouts). With `journal` (a
    RowJournal: vllm_server.journal_at) each message's samples of pass s are its row "pass<s>:<i>" there, and a rerun
    asks only for the rest."""
    from paperflow.promptscale.vllm_server import chat_each

    texts = [[] for _ in messages]
    reasons = [[] for _ in messages]
    for s in range(int(settings["seeds"])):
        samples = chat_each(
            client,
            list(messages),
            n=int(settings["completions_per_seed"]),
            temperature=float(settings["temperature"]),
            top_p=float(settings["top_p"]),
            top_k=int(settings["top_k"]),
            max_tokens=int(settings["max_tokens"]),
            seed=int(settings["seed"]) + s * len(messages),
            journal=journal,
            tag=f"pass{s}:",
        )
        for i, choices in enumerate(samples):
            texts[i] += [c["text"] for c in choices]
            reasons[i] += [c["finish_reason"] for c in choices]
    return texts, reasons


def rollouts(
    policy_folder: str,
    synth_jsonl: str,
    settings: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """The rollouts rule: `seeds` x `completions_per_seed` chat completions of the policy per problem (the math
    instruction of the benchmarks appended), pass s giving prompt i the seed `seed + s * n_problems + i`. Rows
    {"id", "problem", "completions", "finish_reasons"}. Returns counts and the share cut at max_tokens. `journal`:
    a file in the job's checkpoint folder where each prompt's samples are kept as they finish (`play`)."""
    settings = check_settings(settings)
    problems = selfplay_problems(lt.read_jsonl(synth_jsonl), settings["max_problems"])
    if not problems:
        raise ValueError(f"{synth_jsonl}: no valid synthesised math problem to play on")
    messages = [lt.eval_prompt(p["problem"]) for p in problems]
    return play(policy_folder, problems, messages, settings, vllm, dtype, out, server_log, journal)


def play(
    policy_folder: str,
    problems: Sequence[Mapping[str, Any]],
    messages: Sequence[str],
    settings: Mapping[str, Any],
    vllm: Mapping[str, Any],
    dtype: str,
    out: str,
    server_log: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """The policy ("base") served, `sample_passes` on `messages` (one per problem), rows {**problem, "completions",
    "finish_reasons"} written to `out`; returns counts and the share cut at max_tokens (the math and code rollouts).
    With `journal` (a file in the job's checkpoint folder) every prompt's samples are journalled as they finish and
    a rerun asks only for the rest, writing what an uninterrupted run writes; None: nothing is journalled."""
    from paperflow.promptscale.vllm_server import journal_at, served

    with journal_at(journal) as done, served(policy_folder, "base", vllm, server_log, dtype) as client:
        texts, reasons = sample_passes(client, messages, settings, done)
    rows = [{**p, "completions": t, "finish_reasons": r} for p, t, r in zip(problems, texts, reasons)]
    lt.write_jsonl(out, rows)
    n = sum(len(t) for t in texts)
    return {
        "problems": len(rows),
        "completions": n,
        "truncated": sum(r == "length" for rs in reasons for r in rs) / n,
    }
