from paperflow.confu.paper import preprocess
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    i, o = job.input, job.output
    job.note(**preprocess(i.pretrained, list(i.train), i.test, job.params.prompts, o.train, o.test))
