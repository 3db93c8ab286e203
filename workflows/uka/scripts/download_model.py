from paperflow.core.job import snakemake_job
from paperflow.uka.paper import download_model

with snakemake_job(snakemake) as job:
    p = job.params
    doc = download_model(p.pretrained, p.cache, job.output[0], key=p.key)
    job.note(hub=doc["hub"], revision=doc["revision"])
