from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import recipe_data

with snakemake_job(snakemake) as job:
    counts = recipe_data(job.input.train, job.input.validation, job.params.template, dict(job.output.items()))
    job.note(**counts)
