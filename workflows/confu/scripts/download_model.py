from paperflow.confu.paper import download_model
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    doc = download_model(job.wildcards.target, job.params.target, job.params.cache, job.output[0])
    job.note(revision=doc["revision"], folder=doc["folder"])
