import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.dro_flow.claims import build_report

with snakemake_job(snakemake) as job:
    report = build_report(
        frames={name: read_frame(path)[0] for name, path in job.keyed("eval").items()},
        histories=pd.concat(pd.read_csv(path) for path in job.keyed("history").values()),
        params=dict(job.params.items()),
        scale=job.scale,
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
