from paperflow.core.job import snakemake_job
from paperflow.decfus.training import train_run

with snakemake_job(snakemake) as job:
    seeds = list(job.params.seeds)
    info = train_run(
        method=job.wildcards.method,
        train_file=job.input.train,
        test_file=job.input.test,
        partition_files=job.keyed("split", types=(int,)),
        seeds=seeds,
        model=dict(job.params.model),
        train=dict(job.params.train),
        decfus=dict(job.params.decfus),
        out=dict(job.output.items()),
        run_dir=job.params.run_dir,
        wandb=job.params.wandb,
        tags={
            "paper": "decfus",
            "rule": job.rule,
            "dataset": job.wildcards.dataset,
            "partition": job.wildcards.partition,
        },
        checkpoint_dir=job.checkpoint_dir(),  # each seed's rounds, saved every 30 min; a rerun continues them
    )
    job.note(seeds=seeds, **info)
