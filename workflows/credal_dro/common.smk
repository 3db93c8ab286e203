# credal_dro: the functions of its Snakefile (keyed input lists), included by it after the globals they read;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def credal_dro_models(exp):
    """{method: fitted model} of one experiment, for its configured methods."""
    return {m: credal_dro_path("models", exp, f"{m}.json") for m in CREDAL_DRO[exp]["methods"]}


def credal_dro_report_inputs(wildcards):
    """The report's inputs, keyed by experiment."""
    return {
        **keyed("metrics", {e: credal_dro_path("eval", e, "metrics.parquet") for e in CREDAL_DRO_EXPS}),
        **keyed("bulks", {e: credal_dro_path("data", e, "bulks.json") for e in CREDAL_DRO_EXPS}),
    }
