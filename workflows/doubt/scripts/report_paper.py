from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.core.report import publish_job
from paperflow.doubt.paper_report import build_report

with snakemake_job(snakemake) as job:
    report = build_report(read_frame(job.input.metrics)[0], dict(job.params.items()))
    publish_job(job, report)
    job.note(seeds=job.params.seeds)
