from paperflow.confu.offline_prompts import write
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    job.note(**write(job.params.prompts, job.output.train, job.output.test))
