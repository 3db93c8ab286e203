"""The metrics table (judged by the claims of config/enterpriseops_gym.yaml), tables, figures and the report (spec
sections 7, 8 and 11).

The gated claims test the benchmark (its verifiers reject plan errors and accept valid alternative plans; the
random and keyword agents land where they should), not the paper's finding about language models, which needs real
models at paper scale; what holds by construction (golden replay solves its own tasks, the no-op changes nothing, the
HTTP/MCP path replays golden) is asserted by the tests. Every metric is computed here from the episode table and the
validation outputs; an errored episode is scored as a failure, as the official compute_score.py scores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from paperflow.core import plots
from paperflow.core.claims import long_table
from paperflow.core.report import Figure, Report, Table, markdown_table
from paperflow.enterpriseops_gym.metrics import as_failures, macro_by_domain, pass_hat_k_table, summary
from paperflow.enterpriseops_gym.sandbox import TABLES
from paperflow.enterpriseops_gym.tools import DISTRACTORS, TOOLS

EVERY_AGENT = "every_agent"  # the minimum over agents of a per-agent value (S5)
VERIFIERS, ROW_COUNT_VERIFIERS = "verifiers", "row_count_verifiers"  # the mutation test's two checkers
TRAJECTORY_MATCH = "trajectory_match"  # the alternative-plan check's control: calls must equal golden replay's
ALL_MODES = "all_modes"


def _seeded(episodes: pd.DataFrame, world_seed: int, random_seeds: Sequence[int]) -> pd.DataFrame:
    """The episodes, errored ones scored as failures, with the seed of their rows: the random agent's run index -> its
    seed, every other agent the world seed."""
    ok = as_failures(episodes)
    by_run = dict(enumerate(random_seeds))
    ok["seed"] = [by_run[r] if a == "random" else world_seed for a, r in zip(ok["agent"], ok["run"])]
    return ok


def _item_rows(frame: pd.DataFrame, metric: str, column: str, unit: pd.Series) -> list[dict[str, Any]]:
    return [
        {"seed": s, "unit": u, "method": a, "metric": metric, "value": float(v)}
        for s, u, a, v in zip(frame["seed"], unit, frame["agent"], frame[column].astype(float))
    ]


def metrics_table(
    episodes: pd.DataFrame,
    mutants: pd.DataFrame,
    world_seed: int,
    random_seeds: Sequence[int],
    modes: Sequence[str],
    scale: str,
    alternatives: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The long metrics table the config's claims are judged on. Item rows (one per task, or per mode and task for
    `all_modes/...`): `<mode>/success` on feasible tasks, `<mode>/refused_correctly` and `<mode>/side_effect` on
    infeasible ones, `all_modes/success`, `all_modes/same_final_db_as_golden` (the final database hash equals golden
    replay's), `distractor_gain/success` (plus_10 minus oracle success per feasible task) and
    `mutation/every_mutant_caught` per multi-step task (method `verifiers`, or `row_count_verifiers` for the
    row-count verifiers alone), `alternative/accepted` per feasible task (method `verifiers`, or `trajectory_match`
    for the control that compares the calls with golden replay's). Seed rows: `oracle/between_random_and_golden` = min(agent - mean random, golden -
    agent) of oracle feasible success, and `all_modes/pass_minus_success` = verifier pass rate - success rate per
    agent, with its minimum over agents as method `every_agent`."""
    ok = _seeded(episodes, world_seed, random_seeds)
    feasible, infeasible = ok[ok["feasible"]], ok[~ok["feasible"]]
    rows: list[dict[str, Any]] = []
    for mode in modes:
        f, i = feasible[feasible["mode"] == mode], infeasible[infeasible["mode"] == mode]
        rows += _item_rows(f, f"{mode}/success", "overall_success", f["task_id"])
        rows += _item_rows(i, f"{mode}/refused_correctly", "refused_correctly", i["task_id"])
        rows += _item_rows(i, f"{mode}/side_effect", "side_effect", i["task_id"])
    rows += _item_rows(
        feasible, f"{ALL_MODES}/success", "overall_success", feasible["mode"] + ":" + feasible["task_id"]
    )
    golden = ok[ok["agent"] == "golden"].set_index(["mode", "task_id"])["final_db_hash"]
    same = ok.assign(same=[golden.get((m, t)) == h for m, t, h in zip(ok["mode"], ok["task_id"], ok["final_db_hash"])])
    rows += _item_rows(same, f"{ALL_MODES}/same_final_db_as_golden", "same", same["mode"] + ":" + same["task_id"])
    if {"oracle", "plus_10"} <= set(modes):
        wide = feasible.pivot_table(
            index=["seed", "agent", "task_id"], columns="mode", values="overall_success", aggfunc="first"
        ).dropna(subset=["oracle", "plus_10"])
        gain = (wide["plus_10"].astype(float) - wide["oracle"].astype(float)).reset_index(name="gain")
        rows += _item_rows(gain, "distractor_gain/success", "gain", gain["task_id"])
    oracle = feasible[feasible["mode"] == "oracle"]
    rate = oracle.groupby(["agent", "seed"])["overall_success"].mean().astype(float)
    if "random" in rate and "golden" in rate:
        rnd, gold = float(rate["random"].mean()), float(rate["golden"].mean())
        for agent in rate.index.get_level_values(0).unique():
            if agent != "random":
                x = float(rate[agent].mean())
                rows.append(
                    {
                        "seed": world_seed,
                        "method": agent,
                        "metric": "oracle/between_random_and_golden",
                        "value": min(x - rnd, gold - x),
                    }
                )
    diff = ok.groupby(["agent", "seed"])[["verifier_pass_rate", "overall_success"]].mean().astype(float)
    diff = (diff["verifier_pass_rate"] - diff["overall_success"]).reset_index(name="value")
    rows += [
        {"seed": s, "method": a, "metric": f"{ALL_MODES}/pass_minus_success", "value": v}
        for a, s, v in zip(diff["agent"], diff["seed"], diff["value"])
    ]
    pooled = ok.groupby("agent")["verifier_pass_rate"].mean() - ok.groupby("agent")["overall_success"].mean()
    rows.append(
        {
            "seed": world_seed,
            "method": EVERY_AGENT,
            "metric": f"{ALL_MODES}/pass_minus_success",
            "value": float(pooled.min()),
        }
    )
    for method, column in ((VERIFIERS, "caught"), (ROW_COUNT_VERIFIERS, "caught_row_count_only")):
        if column in mutants and not mutants.empty:
            caught = mutants.groupby("task_id")[column].all().astype(float)
            rows += [
                {"seed": world_seed, "unit": t, "method": method, "metric": "mutation/every_mutant_caught", "value": v}
                for t, v in caught.items()
            ]
    if alternatives is not None and not alternatives.empty:
        for method, column in ((VERIFIERS, "accepted"), (TRAJECTORY_MATCH, "trajectory_match")):
            rows += [
                {"seed": world_seed, "unit": t, "method": method, "metric": "alternative/accepted", "value": float(v)}
                for t, v in zip(alternatives["task_id"], alternatives[column])
            ]
    return long_table(rows, scale)


def _alternatives_text(alternatives: pd.DataFrame) -> str:
    if alternatives.empty:
        return "No feasible task."
    by_kind = alternatives.groupby("kind").agg(
        tasks=("task_id", "size"), accepted=("accepted", "mean"), trajectory_match=("trajectory_match", "mean")
    )
    return (
        f"{len(alternatives)} feasible tasks, one alternative plan each (another order of the steps where the "
        "references allow one, else a user found by name instead of email, else extra read-only calls; the final "
        "answer worded differently), replayed on a fresh copy of the seed that mints other ids than golden replay's. Accepted by every verifier / by "
        "trajectory matching (the control), per kind: "
        + "; ".join(
            f"{k} {int(r['tasks'])} tasks: {r['accepted']:.3f} / {r['trajectory_match']:.3f}"
            for k, r in by_kind.iterrows()
        )
        + ". The mutants that must fail are in 'Task set and its validation'."
    )


def _llm_rates(g: pd.DataFrame) -> dict[str, Any]:
    """One row of the language-model table: rates over the episodes `g` (errored ones already failures)."""
    feas, infeas = g[g["feasible"]], g[~g["feasible"]]

    def rate(s: pd.Series) -> str:
        return f"{s.astype(float).mean():.3f} ({int(s.astype(float).sum())}/{len(s)})" if len(s) else "–"

    return {
        "success (feasible)": rate(feas["overall_success"]),
        "verifier pass": f"{feas['verifier_pass_rate'].astype(float).mean():.3f}" if len(feas) else "–",
        "refusal (infeasible)": rate(infeas["refused_correctly"]),
        "side effects": rate(infeas["side_effect"]),
        "episodes with a tool call": rate(g["tool_calls"] > 0),
        "tool calls / episode": f"{g['tool_calls'].mean():.2f}",
        "refused calls": int(g["failed_calls"].sum()),
        "errored": int(g["errored"].notna().sum()),
    }


def llm_section(episodes: pd.DataFrame, run_notes: Mapping[str, Any], llm: Mapping[str, Any]) -> str:
    """The language-model agent's rates per plan variant, tool-set mode and domain (errored episodes as failures), its calls, and
    the measurement behind a null result: the share of episodes in which the model made any parsable tool call."""
    names = [f"llm_{p}" for p in llm["plans"]]
    eps = episodes[episodes["agent"].isin(names)]
    if eps.empty:
        return "No episode of the language-model agent."
    scored = as_failures(eps)
    rows = []
    modes = [llm["mode"], *llm["plain_modes"]]
    for name in names:
        for mode in modes:
            mine = scored[(scored["agent"] == name) & (scored["mode"] == mode)]
            if mine.empty:
                continue
            for domain, g in [("all", mine)] + list(mine.groupby("domain", sort=True)):
                rows.append({"plan": name.removeprefix("llm_"), "mode": mode, "domain": domain, **_llm_rates(g)})
    wall = ", ".join(
        f"{n.removeprefix('llm_')} {run_notes[n]['wall_s']:.0f} s ({run_notes[n]['usage']['prompt_tokens']} prompt + "
        f"{run_notes[n]['usage']['completion_tokens']} completion tokens)"
        for n in names
        if n in run_notes and "wall_s" in run_notes[n]
    )
    return (
        f"{llm['pretrained']['hub']} (the offline copy of `{llm['pretrained']['offline']}` where set), served in the "
        "job by the kit's LocalServer on 127.0.0.1 (tools as a <tools> block in the system message, <tool_call> "
        "blocks parsed into OpenAI tool calls) and run by the ReAct harness the paper-scale models use, greedy, "
        f"max_tokens {llm['harness']['max_tokens']}, at most {llm['harness']['max_iterations']} model calls per "
        f"episode, on the {llm['mode']} tool set's tasks ({eps['task_id'].nunique()} task ids), the plain variant also "
        f"on {', '.join(llm['plain_modes']) or 'no other mode'}. Plans: plain (the task as every "
        "agent gets it), oracle_plan (the golden plan's steps after the request), shuffled_plan (the control: "
        "another template's plan). Errored episodes count as failures. Wall per plan job: "
        + (wall or "n/a")
        + ".\n\n"
        + markdown_table(rows)
    )


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
    alternatives: pd.DataFrame,
    run_notes: Mapping[str, Any],
    params: Mapping[str, Any],
) -> Report:
    agents = [a for a in params["agents"] if a in set(episodes["agent"])]
    modes = list(params["modes"])
    table = metrics_table(
        episodes, mutants, params["world"]["seed"], params["random"]["seeds"], modes, params["scale"], alternatives
    )
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
            "Verifier checks both ways: alternative plans (must pass) and mutants (must fail)",
            _alternatives_text(alternatives),
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
        *(
            [
                (
                    "Language-model agent: success and refusal per plan, mode and domain",
                    llm_section(episodes, run_notes, llm),
                )
            ]
            if (llm := params.get("llm"))
            else []
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
        "legacy distractor twins, template tasks with golden plans and state-derived verifiers, and seven offline or "
        "scripted agents in three tool-set modes. The gated claims are benchmark soundness checks (spec section 7, "
        "labelled as section 11 asks), not the paper's finding about language models.",
        table=table,
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
            Table(
                "table_alternatives",
                "Every feasible task's alternative plan and whether the verifiers (and trajectory matching) accept it",
                alternatives,
            ),
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
