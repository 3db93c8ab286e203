import pandas as pd

from paperflow.confu.claims import build_report
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job

with snakemake_job(snakemake) as job:
    p = job.params
    frame = pd.concat([pd.read_parquet(f) for f in job.input.evals], ignore_index=True)
    history = pd.concat([pd.read_csv(f) for f in job.input.histories], ignore_index=True)
    drafts = pd.concat([pd.read_csv(f) for f in job.input.draft_histories], ignore_index=True)
    report = build_report(frame, history, drafts, dict(p.items()))
    publish_job(job, report)
    job.note(seeds=p.seeds)
