from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import preprocess

with snakemake_job(snakemake) as job:
    doc = preprocess(job.output.vocabulary, job.output.clusterer, job.params.embedding["batch_size"])
    job.note(**doc)
