from paperflow.confu.paper import download_dataset
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    n = download_dataset(job.wildcards.dataset, job.params.dataset, job.params.cache, job.output[0])
    job.note(prompts=n)
