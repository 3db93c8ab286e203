import pandas as pd

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.safer.claims import build_report


def by_dataset(job, name):
    """The rows of every evaluation in group `name` (acc or open), one frame per dataset, in input order."""
    parts = {}
    for (dataset, _method, _group), path in job.keyed(name).items():
        parts.setdefault(dataset, []).append(read_frame(path)[0])
    return {dataset: pd.concat(frames) for dataset, frames in parts.items()}


with snakemake_job(snakemake) as job:
    report = build_report(
        accs=by_dataset(job, "acc"), opens=by_dataset(job, "open"), params=dict(job.params.items()), scale=job.scale
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
