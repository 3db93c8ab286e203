import sys

from paperflow.core.job import snakemake_job
from paperflow.safer.fitting import Engine
from paperflow.safer.prepare import pretrain

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    engine = Engine(
        job.params.engine,
        job.params.run_dir,
        job.params.wandb,
        {"paper": "safer", "rule": job.rule, "dataset": job.wildcards.dataset},
        checkpoint_dir=job.checkpoint_dir() if job.params.engine == "lightning" else None,  # fits resume
    )
    final = pretrain(
        job.input[0],
        dict(job.params.backbone),
        seeds,
        job.output.backbones,
        job.output.losses,
        sys.stderr.isatty(),
        engine,
    )
    job.note(seeds=seeds, final_grace_loss=final, engine=engine.name)
