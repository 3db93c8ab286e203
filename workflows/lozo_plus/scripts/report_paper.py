import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.lozo_plus.paper_report import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        evals=pd.concat([read_frame(p)[0] for p in job.keyed("eval").values()], ignore_index=True),
        curves=pd.concat([pd.read_csv(p) for p in job.keyed("curve").values()], ignore_index=True),
        summaries=pd.concat([pd.read_csv(p) for p in job.keyed("summary").values()], ignore_index=True),
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
