from paperflow.core.job import snakemake_job
from paperflow.itpo.paper import download_hub

with snakemake_job(snakemake) as job:
    p = job.params
    doc = download_hub(p.ref, p.key, p.cache, job.output[0])
    job.note(hub=doc["hub"], revision=doc["revision"], files=len(doc["sha256"]))
