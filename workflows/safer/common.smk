# safer: the functions of its Snakefile (input lists, labels, resources), included by it after the globals they read;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def safer_runs(name):
    """{(dataset, method, group): file `name` of that train/evaluate job}."""
    return {
        (d, m, g): safer_path(SAFER_RUN.format(dataset=d, method=m, group=g), name)
        for d in SAFER_DATASETS
        for m in SAFER_METHODS
        for g in SAFER_GROUPS
    }


def safer_report_inputs(wildcards):
    """Every evaluation's accuracy and open-set rows, keyed by (dataset, method, seed group)."""
    return {**keyed("acc", safer_runs("accuracy.parquet")), **keyed("open", safer_runs("openset.parquet"))}
