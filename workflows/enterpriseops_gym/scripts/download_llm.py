from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.llm import download_model

with snakemake_job(snakemake) as job:
    p = job.params
    doc = download_model(p.pretrained, p.cache, job.output[0])
    job.note(hub=doc["hub"], revision=doc["revision"], offline=doc["offline"])
