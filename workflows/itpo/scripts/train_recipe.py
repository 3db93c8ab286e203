from paperflow.core.job import snakemake_job
from paperflow.itpo.paper import train

with snakemake_job(snakemake) as job:
    w = job.wildcards
    doc = train(
        w.task,
        w.method,
        job.params.seeds,
        job.params.cfg,
        dict(job.input.items()),
        job.output.run,
        turns=job.output.turns,
        checkpoints=str(job.checkpoint_dir()),  # verl saves there and resumes (resume_mode auto)
    )
    job.note(seeds=job.params.seeds, global_step=doc["global_step"])
