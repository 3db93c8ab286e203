from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.prepare import preprocess

with snakemake_job(snakemake) as job:
    counts = preprocess(job.input[0], dict(job.output.items()))
    job.note(rows=counts)
