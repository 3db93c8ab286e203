from paperflow.core.job import snakemake_job
from paperflow.spaef.data import download

with snakemake_job(snakemake) as job:
    download(job.params.name, dict(job.params.spec), job.params.data_seed, job.params.cache, job.output[0])
    job.note(seeds=[job.params.data_seed])
