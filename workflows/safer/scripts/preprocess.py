from paperflow.core.job import snakemake_job
from paperflow.safer.prepare import preprocess

with snakemake_job(snakemake) as job:
    protocol = dict(job.params.protocol)
    info = preprocess(job.input[0], job.params.class_order, protocol, job.output[0])
    job.note(seeds=[protocol["split_seed"]], **info)
