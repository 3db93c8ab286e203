from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import luffy_data

with snakemake_job(snakemake) as job:
    counts = luffy_data(job.input.train, job.input.traces, job.params.template, job.output[0])
    job.note(**counts)
