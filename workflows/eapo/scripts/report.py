import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.eapo.claims import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        curves=pd.concat([pd.read_csv(p) for p in job.keyed("curves").values()], ignore_index=True),
        mechanism=pd.concat([pd.read_csv(p) for p in job.keyed("mechanism").values()], ignore_index=True),
        final=read_frame(job.input.final)[0],
        base_history=pd.read_csv(job.input.base_history),
        prior_curves=pd.read_csv(job.input.prior_curves),
        params=dict(job.params.items()),
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
