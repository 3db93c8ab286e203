from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import download_tasks

with snakemake_job(snakemake) as job:
    p = job.params
    outputs = {m: job.output[m] for m in p.modes} | {"meta": job.output.meta}
    doc = download_tasks(p.dataset, p.modes, p.domains, p.cache, outputs)
    job.note(revision=doc["revision"], rows=doc["rows"])
