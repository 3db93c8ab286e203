"""The benchmark's metrics (spec section 8) over a table of episodes (one row per agent x mode x task x run)."""

from __future__ import annotations

from math import comb

import pandas as pd


def pass_hat_k(c: int, n: int, k: int) -> float:
    """tau-bench's pass^k for one task with c successes in n runs: C(c, k) / C(n, k)."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass^k needs 0 < k <= n and 0 <= c <= n; got c={c}, n={n}, k={k}")
    return comb(c, k) / comb(n, k)


def as_failures(episodes: pd.DataFrame) -> pd.DataFrame:
    """The episodes scored as the official `compute_score.py` scores them: an errored episode stays in every rate as
    a failure (no success, no verifier passed, no correct refusal)."""
    errored = episodes["errored"].notna()
    out = episodes.copy()
    for column, failed in (("overall_success", False), ("verifier_pass_rate", 0.0), ("refused_correctly", False)):
        if column in out:
            out[column] = out[column].astype(object).where(~errored, failed)
    return out


def pass_hat_k_table(episodes: pd.DataFrame) -> pd.DataFrame:
    """pass^k for k = 1..n per agent and mode: the mean over tasks of C(c, k) / C(n, k) (n = runs of the task; an
    errored run is a failed one)."""
    rows = []
    ok = as_failures(episodes)
    for (agent, mode), g in ok.groupby(["agent", "mode"], sort=True):
        per_task = g.groupby("task_id")["overall_success"].agg(["sum", "count"])
        n = int(per_task["count"].min())
        for k in range(1, n + 1):
            values = [pass_hat_k(int(c), int(m), k) for c, m in zip(per_task["sum"], per_task["count"])]
            rows.append({"agent": agent, "mode": mode, "k": k, "n": n, "pass_hat_k": sum(values) / len(values)})
    return pd.DataFrame(rows)


def summary(episodes: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group: task success and verifier pass rate on feasible tasks, refusal accuracy and side-effect rate on
    infeasible ones, tool calls per episode, errored episodes (counted in the rates as failures, `as_failures`)."""
    rows = []
    for key, g in episodes.groupby(by, sort=True):
        ok = as_failures(g)
        feas, infeas = ok[ok["feasible"]], ok[~ok["feasible"]]
        rows.append(
            {
                **dict(zip(by, key if isinstance(key, tuple) else (key,))),
                "episodes": len(g),
                "errored": int(g["errored"].notna().sum()),
                "success": _mean(ok["overall_success"]),
                "feasible_success": _mean(feas["overall_success"]),
                "verifier_pass_rate": _mean(feas["verifier_pass_rate"]),
                "infeasible_success": _mean(infeas["overall_success"]),
                "refusal_accuracy": _mean(infeas["refused_correctly"]),
                "side_effect_rate": _mean(infeas["side_effect"]),
                "tool_calls": _mean(ok["tool_calls"]),
            }
        )
    return pd.DataFrame(rows)


def _mean(s: pd.Series) -> float:
    return float(s.astype(float).mean()) if len(s) else float("nan")


def macro_by_domain(episodes: pd.DataFrame, agent: str, mode: str) -> float:
    """Macro average of feasible-task success over domains (the README leaderboard's "Avg"; errored episodes fail)."""
    scored = as_failures(episodes)
    g = scored[(scored["agent"] == agent) & (scored["mode"] == mode) & scored["feasible"]]
    return float(g.groupby("domain")["overall_success"].mean().mean())
