import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.promptscale.claims import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        curves=pd.concat([pd.read_csv(p) for p in job.keyed("curves").values()], ignore_index=True),
        history=pd.concat([pd.read_csv(p) for p in job.keyed("history").values()], ignore_index=True),
        synthesis=pd.read_csv(job.input.synthesis),
        solver=pd.concat([pd.read_csv(p) for p in job.keyed("solver").values()], ignore_index=True),
        triples=read_frame(job.input.triples)[0],
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
