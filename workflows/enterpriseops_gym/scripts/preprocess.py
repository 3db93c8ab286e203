from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.stages import preprocess

with snakemake_job(snakemake) as job:
    p = job.params
    counts = preprocess(job.input[0], p.tasks, p.modes, dict(job.output.items()))
    job.note(seeds=[p.tasks["seed"]], **counts)
