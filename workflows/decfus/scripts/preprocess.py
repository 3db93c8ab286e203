from paperflow.core.job import snakemake_job
from paperflow.decfus.prepare import preprocess

with snakemake_job(snakemake) as job:
    spec = dict(job.params.spec)
    sizes = preprocess(job.input[0], spec, job.output.train, job.output.test)
    job.note(seeds=[spec["split_seed"]] if "split_seed" in spec else None, sizes=sizes)  # official splits: no seed
