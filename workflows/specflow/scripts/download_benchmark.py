from paperflow.core.job import snakemake_job
from paperflow.specflow.paper import download_benchmark

with snakemake_job(snakemake) as job:
    p = job.params
    rows = download_benchmark(job.wildcards.benchmark, p.bench, p.cache, job.output[0])
    job.note(rows=rows)
