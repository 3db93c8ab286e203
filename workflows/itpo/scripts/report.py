import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.itpo.claims import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        curves=pd.concat([pd.read_csv(p) for p in job.keyed("curves").values()], ignore_index=True),
        turns=read_frame(job.input.turns)[0],
        final=read_frame(job.input.final)[0],
        init_history=pd.read_csv(job.input.init_history),
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
