from paperflow.confu.paper import regenerate
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    w, p = job.wildcards, job.params
    n = regenerate(job.input.pretrained, job.input.train, int(w.shard), p.target, w.target, p.regenerate, job.output[0])
    job.note(sequences=n)
