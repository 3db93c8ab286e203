# mtbl_wc: the functions of its Snakefile (input lists, labels, resources), included by it after the globals they read;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def mtbl_wc_instances(problem):
    """{seed: instance file} of one problem."""
    return {s: mtbl_wc_path("data", problem, f"seed{s}.npz") for s in MTBL_WC_SEEDS}


def mtbl_wc_runs_out(problem):
    """The outputs of a train job on `problem` (a wildcard pattern): its run and history per seed."""
    return {
        **keyed("run", {s: mtbl_wc_path("runs", problem, "{method}", f"seed{s}.npz") for s in MTBL_WC_SEEDS}),
        **keyed(
            "history",
            {s: mtbl_wc_path("runs", problem, "{method}", f"seed{s}_history.parquet") for s in MTBL_WC_SEEDS},
        ),
    }


def mtbl_wc_evaluate_inputs(wildcards):
    """The instance per seed, and the run and its history per (method, seed), of one problem."""
    runs = [(m, s) for m in MTBL_WC_SPECS[wildcards.problem]["methods"] for s in MTBL_WC_SEEDS]
    return {
        **keyed("instance", mtbl_wc_instances(wildcards.problem)),
        **keyed("run", {(m, s): mtbl_wc_path("runs", wildcards.problem, m, f"seed{s}.npz") for m, s in runs}),
        **keyed(
            "history",
            {(m, s): mtbl_wc_path("runs", wildcards.problem, m, f"seed{s}_history.parquet") for m, s in runs},
        ),
    }


def mtbl_wc_report_inputs(wildcards):
    """Per problem: its metrics and curves, and the first seed's instance (the exact front)."""
    return {
        **keyed("metrics", {n: mtbl_wc_path("eval", n, "metrics.parquet") for n in MTBL_WC_PROBLEMS}),
        **keyed("curves", {n: mtbl_wc_path("eval", n, "curves.parquet") for n in MTBL_WC_PROBLEMS}),
        **keyed("front", {n: mtbl_wc_instances(n)[MTBL_WC_SEEDS[0]] for n in MTBL_WC_PROBLEMS}),
    }
