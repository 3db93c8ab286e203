from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.paper import generate_task

with snakemake_job(snakemake) as job:
    p = job.params
    rows = generate_task(job.wildcards.task, p.task, dict(job.output.items()))
    job.note(seeds=[p.task["seed"]], rows=rows)
