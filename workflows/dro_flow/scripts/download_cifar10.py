from paperflow.core.job import snakemake_job
from paperflow.dro_flow.cifar import fetch_sources

with snakemake_job(snakemake) as job:
    fetch_sources(
        dict(job.params.spec), job.output.images, job.output.weights, f"datasets.{job.wildcards.dataset}.data"
    )
