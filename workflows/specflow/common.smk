# specflow: the functions of its workflow (lock lookups, keyed inputs), included first by its Snakefile;
# kept apart so the rule files hold stages only (snakemake --lint). Names carry the slug.


# paper scale (paper.smk): SPECFLOW_LOCK and SPECFLOW_JOBS are defined there
def specflow_locked(repo_type, hub):
    return SPECFLOW_LOCK.get(f"{repo_type}:{hub}")


def specflow_answers(wildcards):
    """The answers files of every (method, budget) job on one benchmark, keyed (method, budget)."""
    return keyed(
        "answers",
        {(m, k): specflow_path("answers", wildcards.benchmark, f"{m}_k{k}.parquet") for m, k in SPECFLOW_JOBS},
    )
