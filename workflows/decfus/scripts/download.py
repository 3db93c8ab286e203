from paperflow.core.job import snakemake_job
from paperflow.decfus.prepare import download

with snakemake_job(snakemake) as job:
    n = download(job.wildcards.dataset, dict(job.params.spec), job.params.cache, job.output[0])
    job.note(images=n)
