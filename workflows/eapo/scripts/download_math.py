from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import download_dataset

with snakemake_job(snakemake) as job:
    p = job.params
    rows = download_dataset(job.wildcards.dataset, p.dataset, p.cache, job.output[0])
    job.note(rows=rows)
