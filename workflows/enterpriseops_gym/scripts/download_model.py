from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import download_model

with snakemake_job(snakemake) as job:
    doc = download_model(job.wildcards.model, job.params.model, job.params.cache, job.output[0])
    job.note(revision=doc["revision"])
