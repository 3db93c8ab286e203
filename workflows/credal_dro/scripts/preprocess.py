from paperflow.core.job import snakemake_job
from paperflow.credal_dro.prepare import preprocess

with snakemake_job(snakemake) as job:
    preprocess(
        job.wildcards.exp, job.input[0], dict(job.params.cfg), job.params.seeds, job.output.splits, job.output.bulks
    )
    job.note(seeds=job.params.seeds)
