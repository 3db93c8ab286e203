# lozo_plus: the functions of its Snakefile (paths, seed groups, keyed inputs), included first by it; names carry
# the slug.


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
