from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import fine_tune_job

with snakemake_job(snakemake) as job:
    p = job.params
    summary = fine_tune_job(
        job.wildcards.which,
        int(job.wildcards.m),
        dict(job.input.items()),
        p.sft,
        p.device,
        p.n_procs,
        job.output.model,
        job.output.history,
    )
    job.note(seeds=[p.sft["seed"]], **summary)
