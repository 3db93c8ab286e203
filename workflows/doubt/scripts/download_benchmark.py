from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import download_benchmark

with snakemake_job(snakemake) as job:
    rows = download_benchmark(job.wildcards.bench, job.params.bench, job.params.cache, job.output[0])
    job.note(rows=rows)
