from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import download_model

with snakemake_job(snakemake) as job:
    doc = download_model(job.wildcards.role, job.params.spec, job.params.cache, job.output[0])
    job.note(hub=doc["hub"], revision=doc["revision"])
