"""The cpu scale's real-pretrained-model part of LOZO+'s report (issue 52, `pretrained_cpu`): MeZO, LOZO and LOZO+
fine-tune SmolLM2-135M-Instruct on the offline review task through the paper-scale functions; this reads their
curves, summaries, probes and evaluations into metrics-table rows (names under `lm/`), a section, a table and a
figure. numpy, pandas and matplotlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from paperflow.core.report import markdown_table, mean_std_text
from paperflow.lozo_plus.claims import LABELS, final_of, rms_probe
from paperflow.lozo_plus.settings import LM_PREFIX as PREFIX
from paperflow.lozo_plus.settings import seeds_of

BASE = "pretrained"  # the method name of the model before fine-tuning


def _one(frame: pd.DataFrame, method: str, seed: int, column: str) -> float:
    """The one value of a (method, seed) run in a frame with a row per run; NaN when the run has none."""
    f = frame[(frame["method"] == method) & (frame["seed"] == seed)]
    if len(f) > 1:
        raise ValueError(f"{len(f)} rows for run ({method}, seed {seed}); one expected")
    return float(f[column].iloc[0]) if len(f) else float("nan")


def metric_rows(lm: Mapping[str, pd.DataFrame], cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (method, seed): the train loss at the budget (last curve point), test accuracy, its gain over the
    pretrained model's, the job's peak resident memory (GiB) and, for the low-rank methods, rho at refresh steps
    (root mean square; NaN without probes); the pretrained model's test accuracy at every seed (one model: paired
    claims against it compare each run with the same number)."""
    evals, curves, summaries, align = lm["evals"], lm["curves"], lm["summaries"], lm["align"]
    base = evals[evals["method"] == BASE]
    base_acc = float(base["test_accuracy"].iloc[0]) if len(base) else float("nan")
    rows = []

    def add(method, seed, metric, value):
        rows.append({"seed": int(seed), "method": method, "metric": PREFIX + metric, "value": float(value)})

    for s in sorted(set(cfg["seeds"]) | set(cfg["report_seeds"])):
        add(BASE, s, "test_accuracy", base_acc)
    for m in cfg["methods"]:
        for s in seeds_of(m, cfg):
            acc = _one(evals, m, s, "test_accuracy")
            add(m, s, "train_loss", final_of(curves, m, s, "train_loss"))
            add(m, s, "test_accuracy", acc)
            add(m, s, "accuracy_gain", acc - base_acc)
            add(m, s, "peak_rss_gib", _one(summaries, m, s, "peak_rss_bytes") / 2**30)
            if m != "mezo":
                add(m, s, "rho_refresh", rms_probe(align, m, s, "rho", refresh=True))
    return rows


def section(lm: Mapping[str, pd.DataFrame], cfg: Mapping[str, Any]) -> tuple[str, str]:
    """(title, markdown) of the pretrained-model part: per method, mean ± std over seeds."""
    table = pd.DataFrame(metric_rows(lm, cfg))
    p, run, task = cfg["pretrained"], cfg["run"], cfg["task"]

    def cell(method, metric, digits=4):
        v = table[(table["method"] == method) & (table["metric"] == PREFIX + metric)]["value"]
        return mean_std_text(v, digits)

    curves = lm["curves"]
    start = curves[curves["forwards"] == 0]
    lines = [
        {
            "method": LABELS.get(m, m),
            "lr": cfg["lr"][m],
            "train loss at 0": mean_std_text(start[start["method"] == m]["train_loss"], 4),
            "train loss at F": cell(m, "train_loss"),
            "test accuracy": cell(m, "test_accuracy"),
            "gain over pretrained": cell(m, "accuracy_gain"),
            "rho at refresh": cell(m, "rho_refresh") if m != "mezo" else "-",
            "peak RSS (GiB)": cell(m, "peak_rss_gib", 2),
        }
        for m in cfg["methods"]
    ]
    evals = lm["evals"]
    base = evals[evals["method"] == BASE]
    acc = float(base["test_accuracy"].iloc[0]) if len(base) else float("nan")
    text = (
        f"{p['hub']} at commit {p['revision'][:12]} (offline: the `{p.get('offline')}` package's GGUF, dequantised to "
        f"{p['dtype']}), fine-tuned by each method for F = {run['budget']} forwards of batches of {run['batch_size']} "
        f"on {cfg['data']['train']} generated reviews ({task['generator']}, MeZO's SST-2 template, trained as "
        f"classification over ' terrible' / ' great'); test on {cfg['data']['test']} reviews. Pretrained model's "
        f"test accuracy: {acc:.4f}. Seeds: {len(cfg['seeds'])} ({', '.join(cfg['report_only']) or 'none'}: "
        f"{len(cfg['report_seeds'])}). Peak RSS is the job's (getrusage): the model's load and the autograd probes at "
        "refresh steps (LOZO, LOZO+; MeZO's once at step 0) included, so it is no measure of the methods' own memory."
        "\n\n" + markdown_table(lines)
    )
    return "A real pretrained model: " + p["hub"], text


def runs_table(lm: Mapping[str, pd.DataFrame], cfg: Mapping[str, Any]) -> pd.DataFrame:
    """The metrics rows as one row per (method, seed)."""
    frame = pd.DataFrame(metric_rows(lm, cfg))
    return frame.pivot_table(index=["method", "seed"], columns="metric", values="value").reset_index()


def figure(lm: Mapping[str, pd.DataFrame], cfg: Mapping[str, Any]):
    from paperflow.lozo_plus.paper_report import figure_loss

    return figure_loss(lm["curves"], list(cfg["methods"]), [cfg["task"]["name"]])
