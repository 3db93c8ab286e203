import sys

from paperflow.core.job import snakemake_job
from paperflow.safer.prepare import pretrain

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    final = pretrain(
        job.input[0], dict(job.params.backbone), seeds, job.output.backbones, job.output.losses, sys.stderr.isatty()
    )
    job.note(seeds=seeds, final_grace_loss=final)
