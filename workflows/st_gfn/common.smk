# st_gfn: the functions of its Snakefile (input lists, labels, resources), included first by it;
# kept apart so the Snakefile holds rules only (snakemake --lint). Names carry the slug.


def st_gfn_runs_of(env, suffix):
    """{method: file} of every method trained on `env` (models/<env>/<method><suffix>)."""
    return {m: st_gfn_path("models", env, f"{m}{suffix}") for m in ST_GFN["env_methods"][env]}


def st_gfn_evaluate_inputs(wildcards):
    """The evaluate job's checkpoints, visits and histories, keyed by method."""
    env = wildcards.env
    return {
        **keyed("model", st_gfn_runs_of(env, ".pt")),
        **keyed("visits", st_gfn_runs_of(env, "_visits.parquet")),
        **keyed("history", st_gfn_runs_of(env, "_history.parquet")),
    }


def st_gfn_report_inputs(wildcards):
    """The report's inputs, keyed by env (and method for the training histories)."""
    return {
        **keyed("metrics", {e: st_gfn_path("eval", e, "metrics.parquet") for e in ST_GFN_ENVS}),
        **keyed("pmfs", {e: st_gfn_path("eval", e, "pmfs.parquet") for e in ST_GFN_ENVS}),
        **keyed("target", {e: st_gfn_path("data", e, "target.parquet") for e in ST_GFN_ENVS}),
        **keyed("history", {(e, m): st_gfn_path("models", e, f"{m}_history.parquet") for e, m in ST_GFN_RUNS}),
    }
