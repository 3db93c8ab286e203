from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.paper import download_task

with snakemake_job(snakemake) as job:
    rows = download_task(job.wildcards.task, job.params.dataset, job.params.cache, dict(job.output.items()))
    job.note(rows=rows)
