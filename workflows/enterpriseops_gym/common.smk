# enterpriseops_gym: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def enterpriseops_gym_task_files():
    """{mode: tasks file} of every configured mode."""
    return {m: enterpriseops_gym_path("tasks", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM["modes"]}


def enterpriseops_gym_runs(wildcards):
    """Every agent's episode traces and run notes, keyed by agent for the evaluation and the report (the language-model
    agents `llm_<plan>` of llm_cpu.smk among them where llm_cpu is set)."""
    llm = ENTERPRISEOPS_GYM.get("llm_cpu")
    agents = list(ENTERPRISEOPS_GYM["agents"]) + ([f"llm_{p}" for p in llm["plans"]] if llm else [])
    return {
        **keyed("runs", {a: enterpriseops_gym_path("runs", f"{a}.jsonl") for a in agents}),
        **keyed("notes", {a: enterpriseops_gym_path("runs", f"{a}_notes.json") for a in agents}),
    }
