import json

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.doubt.claims import build_report

with snakemake_job(snakemake) as job:
    with open(job.input.clusterer) as fh:
        clusterer = json.load(fh)
    report = build_report(
        read_frame(job.input.metrics)[0], read_frame(job.input.per_item)[0], clusterer, dict(job.params.items())
    )
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
