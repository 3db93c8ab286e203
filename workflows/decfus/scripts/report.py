import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.decfus.claims import build_report


def run_logs(job, name):
    """One of the claim dataset's run logs (curves or clients) of every training job, with its labels."""
    return pd.concat(
        pd.read_csv(path).assign(partition=part, method=method)
        for (part, method, _group), path in job.keyed(name).items()
    )


with snakemake_job(snakemake) as job:
    report = build_report(
        frames={key: read_frame(path)[0] for key, path in job.keyed("eval").items()},
        curves=run_logs(job, "curves"),
        clients=run_logs(job, "clients"),
        params=dict(job.params.items()),
        scale=job.scale,
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
