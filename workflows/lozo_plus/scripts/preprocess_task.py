from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.paper import preprocess_task

with snakemake_job(snakemake) as job:
    p = job.params
    raw = {"train": job.input.train, "validation": job.input.validation}
    rows = preprocess_task(
        job.wildcards.task, raw, job.input.pretrained, p.data, p.dev, p.max_length, dict(job.output.items())
    )
    job.note(seeds=[p.data["seed"]], rows=rows)
