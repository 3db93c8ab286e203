from paperflow.core.job import snakemake_job
from paperflow.mtbl_wc.prepare import preprocess

with snakemake_job(snakemake) as job:
    preprocess(
        job.wildcards.problem,
        dict(job.params.spec),
        job.input[0],
        list(job.params.seeds),
        job.params.front_points,
        list(job.output),
    )
    job.note(seeds=job.params.seeds)
