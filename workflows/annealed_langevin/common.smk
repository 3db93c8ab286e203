# annealed_langevin: the functions of its Snakefile (input lists, labels, resources), included first by it;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def annealed_langevin_report_inputs(wildcards):
    """The report's inputs: a KL/TV curve per (target, path, T), and the imaging metrics per (path, T)
    where the imaging experiment runs."""
    return {
        **keyed(
            "curve",
            {(t, p, T): annealed_langevin_path("curves", t, f"{p}_T{T}.parquet") for t, p, T in ANNEALED_LANGEVIN_RUNS},
        ),
        **keyed(
            "imaging",
            {
                (p, T): annealed_langevin_path("imaging", f"{p}_T{T}", "metrics.json")
                for p, T in ANNEALED_LANGEVIN_IMAGING_RUNS
            },
        ),
    }
