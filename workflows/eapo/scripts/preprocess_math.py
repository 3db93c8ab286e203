from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import preprocess

with snakemake_job(snakemake) as job:
    p = job.params
    rows = preprocess(
        job.wildcards.dataset, job.input.raw, job.input.pretrained, p.template, p.max_prompt_length, job.output[0]
    )
    job.note(rows=rows)
