from paperflow.core.job import snakemake_job
from paperflow.credal_dro.prepare import download

with snakemake_job(snakemake) as job:
    meta = download(job.wildcards.exp, dict(job.params.cfg), job.params.seeds, job.params.cache, job.output[0])
    job.note(seeds=job.params.seeds, source=meta["source"])
