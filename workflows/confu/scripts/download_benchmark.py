from paperflow.confu.paper import download_benchmark
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    job.note(questions=download_benchmark(job.params.benchmark, job.params.cache, job.output[0]))
