import pandas as pd

from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.specflow.paper import build_paper_report

with snakemake_job(snakemake) as job:
    p = job.params
    scores = pd.concat([pd.read_csv(f) for f in job.input.scores], ignore_index=True)
    publish_job(job, build_paper_report(scores, dict(p.items())))
    job.note(seeds=list(p.seeds)[:1])
