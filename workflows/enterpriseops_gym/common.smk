# enterpriseops_gym: the functions of its Snakefile (paths, keyed inputs), included first by it; names carry the slug.


def enterpriseops_gym_task_files():
    """{mode: tasks file} of every configured mode."""
    return {m: enterpriseops_gym_path("tasks", f"{m}.jsonl") for m in ENTERPRISEOPS_GYM["modes"]}


def enterpriseops_gym_runs(wildcards):
    """Every agent's episode traces and run notes, keyed by agent for the evaluation and the report."""
    agents = ENTERPRISEOPS_GYM["agents"]
    return {
        **keyed("runs", {a: enterpriseops_gym_path("runs", f"{a}.jsonl") for a in agents}),
        **keyed("notes", {a: enterpriseops_gym_path("runs", f"{a}_notes.json") for a in agents}),
    }
