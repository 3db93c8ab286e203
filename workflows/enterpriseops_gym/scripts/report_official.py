import json

from paperflow.core.io import read_frame
from paperflow.core.job import snakemake_job
from paperflow.enterpriseops_gym.official import report

with snakemake_job(snakemake) as job:
    with open(job.input.meta) as fh:
        meta = json.load(fh)
    outputs = {k: job.output[k] for k in job.output.keys()}
    metrics = report(read_frame(job.input.episodes)[0], job.params.domains, meta, outputs)
    job.note(episodes=metrics["episodes"], errored=metrics["errored"])
