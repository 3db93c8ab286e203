import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.lozo_plus.claims import build_report


def frames(job, name):
    return pd.concat([pd.read_csv(p) for p in job.keyed(name).values()], ignore_index=True)


with snakemake_job(snakemake) as job:
    report = build_report(
        curves=frames(job, "curve"),
        logs=frames(job, "log"),
        align=frames(job, "align"),
        final=read_frame(job.input.final)[0],
        history=pd.read_csv(job.input.history),
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
