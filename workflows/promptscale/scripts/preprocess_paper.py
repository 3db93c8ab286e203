from paperflow.core.job import snakemake_job
from paperflow.promptscale.paper import preprocess

with snakemake_job(snakemake) as job:
    code = list(job.input.code) if "code" in job.input.keys() else []
    counts = preprocess(job.input.seeds, job.params.seeds_data, job.output.train, job.output.heldout, code)
    job.note(seeds=[job.params.seeds_data["seed"]], **counts)
