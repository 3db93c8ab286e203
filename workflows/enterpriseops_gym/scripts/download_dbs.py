from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import download_dbs

with snakemake_job(snakemake) as job:
    doc = download_dbs(job.params.dbs, job.params.cache, job.output[0])
    job.note(git_blob=doc["git_blob"], sql_files=doc["sql_files"])
