from paperflow.core.job import snakemake_job
from paperflow.st_gfn.prepare import preprocess

with snakemake_job(snakemake) as job:
    preprocess(job.input[0], dict(job.params.spec), job.output[0])
