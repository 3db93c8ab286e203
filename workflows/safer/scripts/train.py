import sys

from paperflow.core.job import snakemake_job
from paperflow.safer.fitting import Engine
from paperflow.safer.training import run_training

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    engine = Engine(
        job.params.engine,
        job.params.run_dir,
        job.params.wandb,
        {"paper": "safer", "rule": job.rule, "dataset": job.wildcards.dataset, "method": job.wildcards.method},
        checkpoint_dir=job.checkpoint_dir() if job.params.engine == "lightning" else None,  # fits resume
    )
    info = run_training(
        job.wildcards.method,
        job.input.tasks,
        job.input.backbones,
        dict(job.params.method),
        seeds,
        job.output.states,
        job.output.history,
        sys.stderr.isatty(),
        engine,
    )
    job.note(seeds=seeds, **info)
