from paperflow.core.job import snakemake_job
from paperflow.dualreform.paper import download_data

with snakemake_job(snakemake) as job:
    counts = download_data(job.params.data, job.params.cache, job.output.passages, job.output.turns)
    job.note(**counts)
