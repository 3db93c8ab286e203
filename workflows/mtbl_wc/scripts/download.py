from paperflow.core.job import snakemake_job
from paperflow.mtbl_wc.prepare import download

with snakemake_job(snakemake) as job:
    download(job.wildcards.problem, dict(job.params.spec), list(job.params.seeds), job.params.cache, job.output[0])
    job.note(seeds=job.params.seeds)
