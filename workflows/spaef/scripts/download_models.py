from paperflow.core.job import snakemake_job
from paperflow.spaef.data import fetch_all

with snakemake_job(snakemake) as job:
    for name, files in job.params.models.items():
        fetch_all(name, dict(files), job.params.cache)
