from paperflow.core.job import snakemake_job
from paperflow.dro_flow.prepare import preprocess

with snakemake_job(snakemake) as job:
    preprocess(job.input[0], job.output.train, job.output.test, job.params.standardize)
