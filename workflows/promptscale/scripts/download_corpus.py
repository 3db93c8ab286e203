from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import download_corpus

with snakemake_job(snakemake) as job:
    job.note(**download_corpus(job.wildcards.corpus, job.params.spec, job.params.cache, job.output[0]))
