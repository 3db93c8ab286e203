from paperflow.core.job import snakemake_job
from paperflow.itpo.paper import preprocess

with snakemake_job(snakemake) as job:
    p = job.params
    rows = preprocess(job.wildcards.task, p.task, job.input.raw, job.input.recipe, p.split, dict(job.output.items()))
    job.note(rows=rows)
