import sys

from paperflow.core.job import snakemake_job
from paperflow.safer.training import run_training

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    info = run_training(
        job.wildcards.method,
        job.input.tasks,
        job.input.backbones,
        dict(job.params.method),
        seeds,
        job.output.states,
        job.output.history,
        sys.stderr.isatty(),
    )
    job.note(seeds=seeds, **info)
