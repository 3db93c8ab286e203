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


def lozo_plus_lm_report_inputs():
    """The pretrained-model runs' files the synthetic report reads (cpu scale, `pretrained_cpu`); none elsewhere."""
    if not LOZO_PLUS.get("pretrained_cpu"):
        return {}
    return {
        **lozo_plus_lm_files("curve", "csv"),
        **lozo_plus_lm_files("summary", "csv"),
        **lozo_plus_lm_files("align", "csv"),
        **lozo_plus_lm_evals(),
    }


def lozo_plus_lm_report_outputs():
    """The report's table and figure of the pretrained-model runs (cpu scale, `pretrained_cpu`); none elsewhere."""
    if not LOZO_PLUS.get("pretrained_cpu"):
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
