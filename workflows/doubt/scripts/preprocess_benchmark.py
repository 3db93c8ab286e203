from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import preprocess

with snakemake_job(snakemake) as job:
    rows = preprocess(job.input[0], job.params.limit, job.output[0])
    job.note(rows=rows)
