from paperflow.core.job import snakemake_job
from paperflow.dro_flow.prepare import download

with snakemake_job(snakemake) as job:
    download(job.wildcards.dataset, job.params.kind, dict(job.params.spec), job.params.data_seed, job.output[0])
    job.note(seeds=[job.params.data_seed])
