from paperflow.core.job import snakemake_job
from paperflow.decfus.prepare import preprocess

with snakemake_job(snakemake) as job:
    sizes = preprocess(job.input[0], dict(job.params.spec), job.output.train, job.output.test)
    job.note(seeds=[job.params.spec.get("split_seed", 0)], sizes=sizes)
