from paperflow.core.job import snakemake_job
from paperflow.safer.prepare import download

with snakemake_job(snakemake) as job:
    job.note(**download(job.wildcards.dataset, dict(job.params.spec), job.params.cache, job.output[0]))
