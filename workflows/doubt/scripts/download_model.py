from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import download_model

with snakemake_job(snakemake) as job:
    p = job.params
    doc = download_model(p.spec, p.key, p.cache, job.output[0])
    job.note(hub=doc["hub"], revision=doc["revision"])
