from paperflow.core.job import snakemake_job
from paperflow.eapo.recipes import download

with snakemake_job(snakemake) as job:
    doc = download(job.params.repos, job.params.cache, job.output[0])
    job.note(verl_recipe=doc["verl_recipe"]["commit"], luffy=doc["luffy"]["commit"])
