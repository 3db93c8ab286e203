from paperflow.core.job import snakemake_job
from paperflow.decfus.training import train_run

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    info = train_run(
        method=job.wildcards.method, train_file=job.input.train, test_file=job.input.test,
        partition_file=job.input.partition, seed=seed, model=dict(job.params.model), train=dict(job.params.train),
        decfus=dict(job.params.decfus), out=dict(job.output.items()),
    )
    job.note(seeds=[seed], **info)
