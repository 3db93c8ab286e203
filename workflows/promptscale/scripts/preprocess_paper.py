from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import preprocess

with snakemake_job(snakemake) as job:
    counts = preprocess(job.input[0], job.params.seeds_data, job.output.train, job.output.heldout)
    job.note(seeds=[job.params.seeds_data["seed"]], **counts)
