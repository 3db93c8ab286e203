import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.code_selfplay import pairs_job

with snakemake_job(snakemake) as job:
    p = job.params
    summary = pairs_job(job.input[0], p.selfplay, job.output.pairs)
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(seeds=[p.selfplay["seed"]], **summary)
