# enterpriseops_gym: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.
# The paper-scale ones read the globals of paper.smk (ENTERPRISEOPS_GYM_OFFICIAL, _MODES, _MODELS, _SERVED) when
# they are called.


def enterpriseops_gym_task_files():
    """{mode: tasks file} of every configured mode."""
    return {m: enterpriseops_gym_path("tasks", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM["modes"]}


def enterpriseops_gym_runs(wildcards):
    """Every agent's episode traces and run notes, keyed by agent for the evaluation and the report (the language-model
    agents `llm_<plan>` of llm_cpu.smk among them where llm_cpu is set)."""
    llm = ENTERPRISEOPS_GYM["llm_cpu"]
    agents = list(ENTERPRISEOPS_GYM["agents"]) + ([f"llm_{p}" for p in llm["plans"]] if llm else [])
    return {
        **keyed("runs", {a: enterpriseops_gym_path("runs", f"{a}.jsonl") for a in agents}),
        **keyed("notes", {a: enterpriseops_gym_path("runs", f"{a}_notes.json") for a in agents}),
    }


def enterpriseops_gym_official_raw():
    return {m: enterpriseops_gym_path("raw", "official", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM_MODES}


def enterpriseops_gym_official_tasks():
    return {m: enterpriseops_gym_path("tasks", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM_MODES}


def enterpriseops_gym_model_input(wildcards):
    if wildcards.model in ENTERPRISEOPS_GYM_SERVED:
        return {"model": enterpriseops_gym_path("models", f"{wildcards.model}.json")}
    return {}


def enterpriseops_gym_domain_servers():
    from paperflow.enterpriseops_gym.containers import planned

    official = ENTERPRISEOPS_GYM_OFFICIAL
    # `containers` is optional: without it the job finds the servers running
    containers = official["containers"] if "containers" in official else None
    return planned(containers, sorted(official["servers"]))


def enterpriseops_gym_model_runs():
    return keyed("runs", {m: enterpriseops_gym_path("runs", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM_MODELS})
