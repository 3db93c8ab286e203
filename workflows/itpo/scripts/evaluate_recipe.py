from paperflow.core.job import snakemake_job
from paperflow.itpo.paper import evaluate

with snakemake_job(snakemake) as job:
    w = job.wildcards
    doc = evaluate(w.task, w.method, job.params.cfg, dict(job.input.items()), dict(job.output.items()))
    job.note(seeds=[doc["seed"]], reward=doc["reward"])
