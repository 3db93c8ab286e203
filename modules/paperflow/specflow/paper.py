"""specflow at paper scale (`source.kind: llava`), one function per rule: LLaVA-1.5-7B and each benchmark downloaded
at pinned Hub commits, one GPU job per (method, budget, benchmark) writing LLaVA's answers with the vision tokens
condensed between the projector and the language model (`paperflow.specflow.llava`), the benchmark scores on CPU, and
the report: Table 1's relative score (mean over benchmarks of method / unpruned) per method and budget.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from paperflow.core.claims import long_table
from paperflow.core.hub import snapshot_folder
from paperflow.core.io import read_frame, write_frame
from paperflow.core.report import Figure, Report, Table, fmt, markdown_table
from paperflow.specflow import benchmarks as bm
from paperflow.specflow.settings import budget_of, paper_claim_metric

log = logging.getLogger(__name__)
SLUG = "specflow"
FULL = "full"


def download_benchmark(name: str, bench: Mapping[str, Any], cache: str, out: str) -> int:
    """A benchmark's parquet files (`files`, only those) at the pinned commit, normalised to one question table
    (`benchmarks.questions`; the first `limit` rows when set) with its origin in the metadata. Returns the rows."""
    from paperflow.core.hub import pinned_revision
    from paperflow.core.lm.models import download_pretrained

    hub = bench["hub"]
    key = f"benchmarks.{name}.revision"
    revision = pinned_revision(hub, bench["revision"], slug=SLUG, key=key, repo_type="dataset")
    folder = snapshot_folder(cache, "dataset", hub, revision)
    download_pretrained(hub, revision, folder, allow_patterns=list(bench["files"]), repo_type="dataset")
    frame = bm.questions(bench["kind"], bm.read_parquet_files(folder, bench["files"]))
    if bench.get("limit"):  # the first `limit` questions; MMBench's with all their rotations (CircularEval's unit)
        if bench["kind"] in bm.MMBENCH_SUFFIX:
            frame = frame[frame["group"].isin(frame["group"].drop_duplicates().head(int(bench["limit"])))]
        else:
            frame = frame.head(int(bench["limit"]))
    meta = {"benchmark": name, "kind": bench["kind"], "hub": hub, "revision": revision, "files": list(bench["files"])}
    write_frame(out, frame, meta)
    return len(frame)


def n_tokens(pretrained: Mapping[str, Any]) -> int:
    """N, the visual tokens LLaVA feeds unpruned (576 = 24 x 24 for LLaVA-1.5 at 336 px)."""
    return int(pretrained["tokens"])


def jobs(cfg: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Every (method, budget) evaluation: the unpruned model once at N tokens, every other method at each ratio's
    budget K = N (1 - R) (66.7 / 77.8 / 88.9% -> 192 / 128 / 64 of 576)."""
    n = n_tokens(cfg["pretrained"])
    budgets = [budget_of(r, n) for r in cfg["ratios"]]
    return [(m, n) if m == FULL else (m, k) for m in cfg["methods"] for k in ([n] if m == FULL else budgets)]


def evaluate(
    method: str,
    budget: int,
    pretrained_json: str,
    questions_path: str,
    cfg: Mapping[str, Any],
    out: str,
    journal: str | Path | None = None,
) -> dict[str, Any]:
    """LLaVA's greedy answers to every question of a benchmark with its vision tokens condensed by `method` to
    `budget`; the answers table keeps the question's answers, category and group for the scorer. Each question's
    answer goes to the `journal` (the job's checkpoint folder) as it finishes, and a rerun skips those questions
    (each condensation is seeded by the run's seed per question, so the rest come out as in an uninterrupted run);
    `seconds` is this run's time."""
    from paperflow.core.device import pick
    from paperflow.core.resume import row_journal
    from paperflow.core.seeding import seed_all
    from paperflow.specflow import llava

    pre = cfg["pretrained"]
    device = pick(pre["device"], key="pretrained.device")
    seed = int(cfg["seeds"][0])
    seed_all(seed)
    info = json.loads(Path(pretrained_json).read_text())
    model = llava.load(info["folder"], pre["dtype"], device)
    if model.grid[0] * model.grid[1] != n_tokens(pre):
        raise ValueError(
            f"pretrained.tokens = {pre['tokens']} but the model feeds {model.grid} = "
            f"{model.grid[0] * model.grid[1]} visual tokens"
        )
    frame, meta = read_frame(questions_path)
    t0 = time.perf_counter()
    with row_journal(journal) as done:
        for q in frame.itertuples(index=False):
            if _plain(q.qid) in done:
                continue
            got = llava.answer(model, q.image, q.question, method, budget, cfg, seed, pre["max_new_tokens"])
            done.append({"id": _plain(q.qid), "got": {k: _plain(v) for k, v in got.items()}})
        answered = done.complete([_plain(qid) for qid in frame["qid"]])
    keys = sorted({k for a in answered for k in a["got"]})  # one order, whether a row was journalled or not
    rows = [
        {"qid": q.qid, "answers": q.answers, "category": q.category, "group": q.group, **a["got"]}
        for q, a in zip(frame.itertuples(index=False), answered)
    ]
    answers = pd.DataFrame(rows, columns=["qid", "answers", "category", "group", *keys])
    info = {
        "method": method,
        "budget": int(budget),
        "benchmark": meta["benchmark"],
        "kind": meta["kind"],
        "revision": info["revision"],
        "seconds": time.perf_counter() - t0,
    }
    write_frame(out, answers, info)
    return info


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value a JSON journal keeps."""
    return value.item() if hasattr(value, "item") else value


def score_benchmark(answers: Mapping[tuple[str, int], str]) -> pd.DataFrame:
    """The benchmark's score for every (method, budget) answers file: benchmark, method, budget, k_fed (mean tokens
    fed), score, questions, prune_ms (mean)."""
    rows = []
    for (method, budget), path in sorted(answers.items()):
        frame, meta = read_frame(path)
        rows.append(
            {
                "benchmark": meta["benchmark"],
                "method": method,
                "budget": int(budget),
                "k_fed": float(frame["k_fed"].mean()),
                "score": bm.score(meta["kind"], frame),
                "questions": len(frame),
                "prune_ms": float(frame["prune_ms"].mean()),
            }
        )
    return pd.DataFrame(rows)


def relative_table(scores: pd.DataFrame) -> pd.DataFrame:
    """Table 1's "Average" per (method, budget): the mean over benchmarks of 100 x score / the unpruned model's
    score on that benchmark (spec section 8); the per-benchmark scores beside it."""
    full = scores[scores.method == FULL].set_index("benchmark")["score"]
    if full.empty:
        raise ValueError("the scores hold no unpruned ('full') row: relative scores need it")
    rel = scores.assign(relative=100 * scores["score"] / scores["benchmark"].map(full))
    wide = rel.pivot_table(index=["method", "budget"], columns="benchmark", values="score").reset_index()
    avg = rel.groupby(["method", "budget"], as_index=False).agg(relative=("relative", "mean"), k_fed=("k_fed", "mean"))
    return avg.merge(wide, on=["method", "budget"]).sort_values(["budget", "relative"], ascending=[False, False])


def metrics_table(scores: pd.DataFrame, cfg: Mapping[str, Any]) -> pd.DataFrame:
    """The long metrics table the paper-scale claims of config/specflow.yaml are judged on: per ratio, method and
    benchmark (the item), 100 x score / the unpruned model's score on that benchmark, named "relative@<ratio>"; its
    mean over the benchmarks is Table 1's "Average" (relative_table). One seed: decoding is greedy."""
    full = scores[scores.method == FULL].set_index("benchmark")["score"]
    if full.empty:
        raise ValueError("the scores hold no unpruned ('full') row: relative scores need it")
    n, seed = n_tokens(cfg["pretrained"]), int(list(cfg["seeds"])[0])
    rel = scores.assign(relative=100 * scores["score"] / scores["benchmark"].map(full))
    rows = [
        {
            "seed": seed,
            "unit": r.benchmark,
            "method": r.method,
            "metric": paper_claim_metric(ratio),
            "value": r.relative,
        }
        for ratio in cfg["ratios"]
        for r in rel[(rel.method != FULL) & (rel.budget == budget_of(float(ratio), n))].itertuples()
    ]
    return long_table(rows, cfg["scale"])


def build_paper_report(scores: pd.DataFrame, cfg: Mapping[str, Any]) -> Report:
    """The paper-scale report: the metrics table the config's claims judge, the relative-score table per method and budget, the per-benchmark scores
    and the relative score vs budget figure."""
    import matplotlib.pyplot as plt

    table = relative_table(scores)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, sub in table[table.method != FULL].groupby("method"):
        sub = sub.sort_values("budget")
        ax.plot(
            sub.budget,
            sub.relative,
            marker="o",
            label=method,
            **({"lw": 2.5, "color": "k"} if method == "specflow" else {}),
        )
    ax.set_xlabel("visual tokens kept (K)")
    ax.set_ylabel("average relative score (%)")
    ax.legend(fontsize=6)
    shown = table.to_dict("records")
    for r in shown:
        for key, value in r.items():
            if isinstance(value, float):
                r[key] = fmt(value, 2)
    benches = sorted(scores.benchmark.unique())
    fastv = f" (FastV inside it, after layer {cfg['pretrained']['fastv_layer']})" if "fastv" in cfg["methods"] else ""
    return Report(
        title="SpecFlow at paper scale: LLaVA-1.5-7B, training-free visual token condensation",
        summary=(
            f"LLaVA-1.5-7B ({cfg['pretrained']['hub']}) on {', '.join(benches)}; every method condenses the "
            f"{n_tokens(cfg['pretrained'])} projector tokens once before the language model{fastv}. Relative score = mean "
            "over benchmarks of score / the unpruned model's score (Table 1's Average)."
        ),
        table=metrics_table(scores, cfg),
        sections=[("Average relative score and per-benchmark scores", markdown_table(shown))],
        figures=[Figure("figure_relative", "Average relative score vs tokens kept", fig)],
        tables=[
            Table("table_relative", "Per method and budget: relative score and the benchmark scores", table),
            Table("table_scores", "Every (benchmark, method, budget) score", scores),
        ],
        limitations=[
            "Only the benchmarks of `benchmarks` are run (VQAv2, VizWiz and the video benchmarks are not wired; "
            "MMBench's option matching stops before the official GPT judge: an unmatched completion counts wrong); "
            "PDrop, SparseVLM, DART and HoloV (their own code) are not run; FastV's prune_ms excludes its ranking, "
            "which runs inside the language model; one seed (greedy decoding is deterministic).",
        ],
        metrics={
            "relative": table.astype(object).where(table.notna(), None).to_dict("records"),
            "ks": sorted({int(b) for b in scores.budget}),
        },
    )
