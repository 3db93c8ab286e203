from paperflow.core.job import snakemake_job
from paperflow.st_gfn.sources import download

with snakemake_job(snakemake) as job:
    download(job.wildcards.env, dict(job.params.spec), job.params.cache, job.output[0])
