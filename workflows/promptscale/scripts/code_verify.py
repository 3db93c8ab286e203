import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.code_selfplay import verify

with snakemake_job(snakemake) as job:
    journal = job.checkpoint_dir() / "rows.jsonl"  # graded problems; a rerun grades only the rest
    summary = verify(job.input.tests, job.input.rollouts, job.params.limits, job.threads, job.output.verified, journal)
    with open(job.output.summary, "w") as out:
        json.dump(summary, out, indent=1)
    job.note(**summary)
