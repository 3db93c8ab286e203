# lozo_plus: the functions of its Snakefile and of the scale files it includes (paths, seed groups, keyed inputs),
# included first by it; names carry the slug.


def lozo_plus_groups(method):
    """{group: seeds} of a method: its seeds (report-only methods: `report_seeds`) cut by `seeds_per_job`."""
    from paperflow.lozo_plus.settings import seeds_of

    return seed_groups(seeds_of(method, LOZO_PLUS), LOZO_PLUS["seeds_per_job"])


def lozo_plus_runs():
    """Every (method, group) train job."""
    return [(m, g) for m in LOZO_PLUS["methods"] for g in lozo_plus_groups(m)]


def lozo_plus_run_files(name):
    """One of a train job's outputs (models, curve, log, align) for every (method, group), keyed (method, group)."""
    ext = "safetensors" if name == "models" else "csv"
    return keyed(name, {(m, g): lozo_plus_path("runs", m, g, f"{name}.{ext}") for m, g in lozo_plus_runs()})


def lozo_plus_seeds_of_group(wildcards):
    return lozo_plus_groups(wildcards.method)[wildcards.group]


def lozo_plus_lm_report_inputs():
    """The pretrained-model runs' files the synthetic report reads (cpu scale, `pretrained_cpu`); none elsewhere."""
    if not LOZO_PLUS["pretrained_cpu"]:
        return {}
    return {
        **lozo_plus_lm_files("curve", "csv"),
        **lozo_plus_lm_files("summary", "csv"),
        **lozo_plus_lm_files("align", "csv"),
        **lozo_plus_lm_evals(),
    }


def lozo_plus_lm_report_outputs():
    """The report's table and figure of the pretrained-model runs (cpu scale, `pretrained_cpu`); none elsewhere."""
    if not LOZO_PLUS["pretrained_cpu"]:
        return {}
    return {
        "table_lm": report(
            lozo_plus_path("tables", "pretrained_runs.csv"), category="lozo_plus", labels={"table": "pretrained model"}
        ),
        "figure_lm_loss": report(
            lozo_plus_path("figures", "pretrained_loss_vs_forwards.png"),
            category="lozo_plus",
            labels={"figure": "pretrained model: train loss vs forwards"},
        ),
    }


# paper scale (paper.smk)


def lozo_plus_methods_on(node):
    """The methods whose train job takes one GPU (node False) or several (node True), as a wildcard pattern."""
    found = [m for m, n in LOZO_PLUS_GPUS.items() if (n > 1) == node]
    return "|".join(found) or LOZO_PLUS_NONE


def lozo_plus_dataset(wildcards):
    return LOZO_PLUS["tasks"][wildcards.task]


def lozo_plus_locked(repo_type, hub):
    return LOZO_PLUS_LOCK.get(f"{repo_type}:{hub}")


def lozo_plus_max_new_tokens(wildcards):
    """MeZO's generation budget of the task: its `max_new_tokens` (the generation tasks), else 50."""
    task = LOZO_PLUS["tasks"][wildcards.task]
    return task["max_new_tokens"] if "max_new_tokens" in task else 50


def lozo_plus_paper_files(name, ext):
    """One file of every (task, method, group) run, keyed (task, method, group)."""
    runs = [(t, m, g) for t in LOZO_PLUS_TASKS for m, g in lozo_plus_runs()]
    return keyed(name, {(t, m, g): lozo_plus_path("runs", t, m, g, f"{name}.{ext}") for t, m, g in runs})


# the pretrained model at cpu scale (pretrained_cpu.smk)


def lozo_plus_lm_path(*parts):
    return lozo_plus_path("lm", *parts)


def lozo_plus_lm_runs():
    """Every (method, group) train job of the pretrained model: one seed per job (`report_seeds` for the methods
    in `report_only`)."""
    from paperflow.lozo_plus.settings import seeds_of

    return [(m, f"s{s}") for m in LOZO_PLUS_LM["methods"] for s in seeds_of(m, LOZO_PLUS_LM)]


def lozo_plus_lm_files(name, ext):
    """One file of every pretrained-model run, keyed (method, group) under `lm_<name>`."""
    t = LOZO_PLUS_LM_TASK
    return keyed(
        f"lm_{name}",
        {(m, g): lozo_plus_lm_path("runs", t, m, g, f"{name}.{ext}") for m, g in lozo_plus_lm_runs()},
    )


def lozo_plus_lm_evals():
    t = LOZO_PLUS_LM_TASK
    runs = {(m, g): lozo_plus_lm_path("eval", t, f"{m}_{g}.parquet") for m, g in lozo_plus_lm_runs()}
    return keyed("lm_eval", {**runs, ("pretrained", "s0"): lozo_plus_lm_path("eval", t, "pretrained.parquet")})
