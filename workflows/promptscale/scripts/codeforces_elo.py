import json

from paperflow.core.job import snakemake_job
from paperflow.promptscale.codeforces import elo_job

with snakemake_job(snakemake) as job:
    doc = elo_job(
        job.wildcards.policy, job.input.submissions, job.input.verdicts, job.input.contests, job.params.settings
    )
    with open(job.output[0], "w") as out:
        json.dump(doc, out, indent=1)
    job.note(elo=doc["elo"], contests_rated=doc["contests_rated"], contests_skipped=doc["contests_skipped"])
