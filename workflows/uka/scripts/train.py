from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.uka.stages import train

with snakemake_job(snakemake) as job:
    w = job.wildcards
    memory, attempts = train(
        w.world, w.method, job.input.users, job.input.embeddings, job.params.settings, job.params.seeds
    )
    write_frame(job.output.memory, memory, {"world": w.world, "method": w.method})
    attempts.assign(world=w.world, method=w.method).to_csv(job.output.attempts, index=False)
    job.note(seeds=job.params.seeds, entries=memory.groupby("seed").size().to_dict())
