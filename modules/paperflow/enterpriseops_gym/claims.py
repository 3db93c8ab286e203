"""Claims, tables, figures and the report (spec sections 7, 8 and 11).

The gated claims S1-S6 and the mutation test are proofs that the benchmark is sound (its verifiers are satisfiable,
non-trivial, sensitive, and the HTTP/MCP path is faithful), not the paper's finding about language models, which
needs real models at paper scale. Every claim is computed here from the episode table and the validation outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import plots
from paperflow.core.report import Claim, Figure, Report, Table, compare_claim, markdown_table
from paperflow.enterpriseops_gym.metrics import macro_by_domain, pass_hat_k_table, summary
from paperflow.enterpriseops_gym.sandbox import TABLES
from paperflow.enterpriseops_gym.tools import DISTRACTORS, TOOLS

SOUNDNESS = "benchmark soundness, not the paper's LLM finding"
RANDOM_CEILING = 0.10
MUTATION_THRESHOLD = 0.95


def _rate(episodes: pd.DataFrame, column: str, **where: Any) -> float:
    g = episodes[episodes["errored"].isna()]
    for key, value in where.items():
        g = g[g[key] == value]
    return float(g[column].astype(float).mean()) if len(g) else float("nan")


def build_claims(
    episodes: pd.DataFrame, mutants: pd.DataFrame, world_seed: int, random_seeds: Sequence[int]
) -> list[Claim]:
    seed = [world_seed]
    modes = sorted(episodes["mode"].unique())
    golden = [_rate(episodes, "overall_success", agent="golden", mode=m, feasible=True) for m in modes]
    rnd = [
        _rate(episodes[episodes["run"] == i], "overall_success", agent="random", mode="oracle", feasible=True)
        for i, _ in enumerate(random_seeds)
    ]
    heur = _rate(episodes, "overall_success", agent="heuristic", mode="oracle", feasible=True)
    gold_oracle = _rate(episodes, "overall_success", agent="golden", mode="oracle", feasible=True)
    heur10 = _rate(episodes, "overall_success", agent="heuristic", mode="plus_10", feasible=True)
    gaps = []
    for _, g in episodes[episodes["errored"].isna()].groupby("agent"):
        gaps.append(float(g["verifier_pass_rate"].mean() - g["overall_success"].astype(float).mean()))
    claims = [
        compare_claim(
            id="S1_golden_solves_every_feasible_task",
            statement=f"S1 ({SOUNDNESS}): golden replay succeeds on every feasible task in every mode "
            f"(worst mode of {', '.join(modes)})",
            values=[min(golden)],
            threshold=1.0,
            comparison=">=",
            seeds=seed,
        ),
        compare_claim(
            id="S2_noop_fails_feasible",
            statement=f"S2 ({SOUNDNESS}): the no-op agent succeeds on no feasible task (oracle mode)",
            values=[_rate(episodes, "overall_success", agent="noop", mode="oracle", feasible=True)],
            threshold=0.0,
            comparison="<=",
            seeds=seed,
        ),
        compare_claim(
            id="S2_noop_refuses_infeasible",
            statement=f"S2 ({SOUNDNESS}): the no-op agent refuses every infeasible task correctly (oracle mode)",
            values=[_rate(episodes, "refused_correctly", agent="noop", mode="oracle", feasible=False)],
            threshold=1.0,
            comparison=">=",
            seeds=seed,
        ),
        compare_claim(
            id="S2_noop_no_side_effects",
            statement=f"S2 ({SOUNDNESS}): the no-op agent leaves no side effect on infeasible tasks (protected-table "
            "hash changed; oracle mode)",
            values=[_rate(episodes, "side_effect", agent="noop", mode="oracle", feasible=False)],
            threshold=0.0,
            comparison="<=",
            seeds=seed,
        ),
        compare_claim(
            id="S3_random_at_most_10pct",
            statement=f"S3 ({SOUNDNESS}): the random agent's feasible-task success is at most {RANDOM_CEILING:.0%} "
            "(oracle mode; worst random seed)",
            values=rnd,
            threshold=RANDOM_CEILING,
            comparison="<=",
            seeds=list(random_seeds),
            aggregate="max",
        ),
        compare_claim(
            id="S3_heuristic_between_random_and_golden",
            statement=f"S3 ({SOUNDNESS}): the keyword heuristic lies strictly between random and golden (oracle mode; "
            "value = min(heuristic - mean random, golden - heuristic))",
            values=[min(heur - float(np.mean(rnd)), gold_oracle - heur)],
            threshold=0.0,
            comparison=">",
            seeds=seed,
        ),
        compare_claim(
            id="S4_distractors_cost_heuristic",
            statement=f"S4 ({SOUNDNESS}): ten distractor tools do not help the heuristic (success plus_10 - oracle)",
            values=[heur10 - heur],
            threshold=0.0,
            comparison="<=",
            seeds=seed,
        ),
        compare_claim(
            id="S5_pass_rate_at_least_success",
            statement=f"S5 ({SOUNDNESS}): for every agent the verifier pass rate is at least the task success rate "
            "(min over agents of the difference)",
            values=[min(gaps)],
            threshold=0.0,
            comparison=">=",
            seeds=seed,
        ),
        compare_claim(
            id="S6_mock_llm_http_equals_golden",
            statement=f"S6 ({SOUNDNESS}): the scripted model through the HTTP endpoint (and MCP tools) ends in golden "
            "replay's final database on every task and mode (share of identical hashes)",
            values=[hash_agreement(episodes, "mock_llm", "golden")],
            threshold=1.0,
            comparison=">=",
            seeds=seed,
        ),
        compare_claim(
            id="mutation_test_catches_plan_errors",
            statement=f"Mutation test (section 11, {SOUNDNESS}): the golden plan minus one step or with one perturbed "
            "argument fails a verifier, for every mutant, in this share of multi-step tasks",
            values=[mutation_share(mutants)],
            threshold=MUTATION_THRESHOLD,
            comparison=">=",
            seeds=seed,
        ),
    ]
    claims += [
        compare_claim(
            id=f"refusal_{agent}",
            statement=f"Reported: infeasible-refusal accuracy of {agent} (oracle mode)",
            values=[_rate(episodes, "refused_correctly", agent=agent, mode="oracle", feasible=False)],
            threshold=0.0,
            comparison=">=",
            seeds=seed,
            gated=False,
            paper_value="best model 53.9% (arXiv v1)" if agent == "heuristic" else None,
        )
        for agent in ("heuristic", "golden_guided")
        if agent in set(episodes["agent"])
    ]
    return claims


def hash_agreement(episodes: pd.DataFrame, agent: str, reference: str) -> float:
    a = episodes[episodes["agent"] == agent].set_index(["mode", "task_id"])["final_db_hash"]
    b = episodes[(episodes["agent"] == reference) & (episodes["run"] == 0)].set_index(["mode", "task_id"])[
        "final_db_hash"
    ]
    joined = pd.concat([a.rename("a"), b.rename("b")], axis=1, join="inner")
    return float((joined["a"] == joined["b"]).mean()) if len(joined) and len(joined) == len(a) else float("nan")


def mutation_share(mutants: pd.DataFrame) -> float:
    if mutants.empty:
        return float("nan")
    return float(mutants.groupby("task_id")["caught"].all().mean())


def figure_success(table: pd.DataFrame, agents: Sequence[str], modes: Sequence[str]):
    fig, (ax,) = plots.subplots(1, width=7.5, height=3.8)
    width = 0.8 / len(modes)
    x = np.arange(len(agents))
    for i, mode in enumerate(modes):
        vals = [
            float(table[(table["agent"] == a) & (table["mode"] == mode)]["feasible_success"].iloc[0]) for a in agents
        ]
        ax.bar(x + i * width - 0.4 + width / 2, vals, width, label=mode)
    ax.set_xticks(x, agents, rotation=20)
    ax.set_ylabel("feasible-task success")
    ax.set_ylim(0, 1.05)
    ax.set_title("Task success per agent and tool-set mode")
    ax.legend(fontsize=8)
    return fig


def figure_domains(per_domain: pd.DataFrame, agents: Sequence[str]):
    domains = sorted(per_domain["domain"].unique())
    grid = np.array(
        [
            [
                float(per_domain[(per_domain["agent"] == a) & (per_domain["domain"] == d)]["feasible_success"].iloc[0])
                for d in domains
            ]
            for a in agents
        ]
    )
    fig, (ax,) = plots.subplots(1, width=5.5, height=3.8)
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(domains)), domains)
    ax.set_yticks(range(len(agents)), agents)
    for i in range(len(agents)):
        for j in range(len(domains)):
            ax.text(
                j, i, f"{grid[i, j]:.2f}", ha="center", va="center", color="w" if grid[i, j] < 0.6 else "k", fontsize=8
            )
    fig.colorbar(im, ax=ax, label="feasible-task success (oracle)")
    ax.set_title("Success per domain (oracle mode)")
    return fig


def build_report(
    episodes: pd.DataFrame,
    acceptance: pd.DataFrame,
    validation: Mapping[str, Any],
    mutants: pd.DataFrame,
    run_notes: Mapping[str, Any],
    params: Mapping[str, Any],
) -> Report:
    agents = [a for a in params["agents"] if a in set(episodes["agent"])]
    modes = list(params["modes"])
    claims = build_claims(episodes, mutants, params["world"]["seed"], params["random"]["seeds"])
    by_mode = summary(episodes, ["agent", "mode"])
    by_domain = summary(episodes[episodes["mode"] == "oracle"], ["agent", "domain"])
    passk = pass_hat_k_table(episodes)
    lines = []
    for a in agents:
        row = {"agent": a}
        for m in modes:
            s = by_mode[(by_mode["agent"] == a) & (by_mode["mode"] == m)].iloc[0]
            row[f"{m} success"] = f"{s['feasible_success']:.3f}"
            row[f"{m} verifier pass"] = f"{s['verifier_pass_rate']:.3f}"
        s = by_mode[(by_mode["agent"] == a) & (by_mode["mode"] == "oracle")].iloc[0]
        row["refusal (oracle)"] = f"{s['refusal_accuracy']:.3f}"
        row["side effects (oracle)"] = f"{s['side_effect_rate']:.3f}"
        row["macro over domains (oracle)"] = f"{macro_by_domain(episodes, a, 'oracle'):.3f}"
        row["errored"] = int(by_mode[by_mode["agent"] == a]["errored"].sum())
        lines.append(row)
    domain_lines = [
        {
            "agent": a,
            **{
                d: f"{float(g['feasible_success'].iloc[0]):.3f}"
                for d, g in by_domain[by_domain["agent"] == a].groupby("domain")
            },
        }
        for a in agents
    ]
    passk_lines = [
        {"agent": r["agent"], "mode": r["mode"], "k": int(r["k"]), "n": int(r["n"]), "pass^k": f"{r['pass_hat_k']:.3f}"}
        for _, r in passk[passk["n"] > 1].iterrows()
    ]
    iso = validation["reset_isolation"]
    steps = pd.Series(validation["golden_steps"])
    mock = run_notes.get("mock_llm", {})
    mock_eps = episodes[episodes["agent"] == "mock_llm"]
    kinds = mutants.groupby("kind")["caught"].mean() if not mutants.empty else pd.Series(dtype=float)
    sections = [
        (
            "Success per agent and mode (feasible tasks; refusal and side effects on infeasible ones)",
            markdown_table(lines),
        ),
        ("Success per domain (oracle mode, feasible tasks)", markdown_table(domain_lines)),
        ("pass^k (agents with several runs per task)", markdown_table(passk_lines)),
        (
            "Task set and its validation",
            f"{validation['tasks']} tasks ({int(acceptance['feasible'].sum())} feasible, "
            f"{int((~acceptance['feasible']).sum())} infeasible: "
            + ", ".join(
                f"{k} {v}"
                for k, v in episodes[~episodes["feasible"]]
                .drop_duplicates("task_id")["infeasible_kind"]
                .value_counts()
                .sort_index()
                .items()
            )
            + f"); golden plans of {int(steps.min())}-{int(steps.max())} steps (mean {steps.mean():.2f}); "
            f"{acceptance['n_verifiers'].mean():.1f} verifiers per task on average. Acceptance check 10.1 (golden "
            f"passes every verifier; the untouched seed fails a feasible task's verifiers and passes an infeasible "
            f"one's unchanged checks): {validation['sound']} of {validation['tasks']} tasks. Reset isolation (10.3): "
            f"{iso['identical']} of {iso['pairs']} interleaved reruns ended in the identical database hash; seed "
            f"template unchanged: {iso['seed_unchanged']}. Mutation test: {len(mutants)} mutants of "
            f"{mutants['task_id'].nunique() if not mutants.empty else 0} multi-step tasks; caught share by kind: "
            + ", ".join(f"{k} {v:.3f}" for k, v in kinds.items())
            + ".",
        ),
        (
            "The HTTP and MCP path",
            f"The scripted model ran {len(mock_eps)} episodes through the OpenAI-compatible endpoint on 127.0.0.1 "
            f"with tools over {mock.get('transport', 'n/a')}; the harness retried "
            f"{mock.get('usage', {}).get('retries', 'n/a')} HTTP 503 answer(s) of the endpoint; the tools refused "
            f"{int(mock_eps['failed_calls'].sum())} invalid call(s) (one injected per conversation) and "
            f"{int(mock_eps['overall_success'].sum())} of {len(mock_eps)} episodes succeeded after them. Token counts are "
            "length/4 estimates: "
            f"{mock.get('usage', {}).get('prompt_tokens', 'n/a')} prompt, "
            f"{mock.get('usage', {}).get('completion_tokens', 'n/a')} completion.",
        ),
        (
            "The paper's numbers (not comparable at this scale)",
            "Best model success 34.1% (Claude Sonnet 4.5, ICML abstract) or 37.4% (Claude Opus 4.5, arXiv v1); best "
            "infeasible-refusal rate 53.9%; oracle human plans add 14-35 points. These need frontier models on the "
            "official 1,150 tasks; the agents here are offline bounds that test the benchmark itself.",
        ),
    ]
    return Report(
        title="EnterpriseOps-Gym: a stateful enterprise sandbox and its harness (smoke reconstruction)",
        summary="A seeded 18-table SQLite world (ITSM, HR, CSM and shared identity/audit), policy-enforcing tools with "
        "legacy distractor twins, template tasks with golden plans and state-derived verifiers, and six offline or "
        "scripted agents in three tool-set modes. The gated claims are benchmark soundness checks (spec section 7, "
        "labelled as section 11 asks), not the paper's finding about language models.",
        claims=claims,
        sections=sections,
        figures=[
            Figure(
                "figure_success", "Feasible-task success per agent and mode", figure_success(by_mode, agents, modes)
            ),
            Figure("figure_domains", "Success per domain (oracle)", figure_domains(by_domain, agents)),
        ],
        tables=[
            Table("table_agents", "Per agent and mode: success, verifier pass rate, refusal, side effects", by_mode),
            Table("table_domains", "Per agent and domain (oracle mode)", by_domain),
            Table("table_pass_k", "pass^k per agent and mode", passk),
            Table("table_mutation", "Every mutant of the mutation test and whether a verifier caught it", mutants),
        ],
        limitations=[
            f"The sandbox, tools and tasks are our reconstruction (spec section 2's 'eog'): {len(TABLES)} tables, "
            f"{len(TOOLS)} tools and {len(DISTRACTORS)} distractors instead of 164 tables and 512 tools; the official "
            "task set and servers are not used at this scale.",
            "The response-check judge is deterministic (substring or refusal rule) instead of an LLM judge.",
            "Golden plans are shorter than the spec's 3-10 steps (lengths in 'Task set and its validation'): the "
            "templates are short enterprise workflows.",
            "Paper scale (official tasks, vLLM-served open models, API models) is not wired: its downloads are not "
            "pinned (issue 18).",
        ],
        metrics={
            "episodes": int(len(episodes)),
            "tasks": int(validation["tasks"]),
            "sound_tasks": int(validation["sound"]),
            "reset_isolation_identical": int(iso["identical"]),
            "mutants": int(len(mutants)),
        },
    )
