from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.uka.stages import evaluate

with snakemake_job(snakemake) as job:
    w = job.wildcards
    memory = job.input.memory if "memory" in job.input.keys() else None
    per_user, per_turn = evaluate(
        w.world, w.method, job.input.users, job.input.embeddings, memory, job.params.settings, job.params.seeds
    )
    write_frame(job.output.per_user, per_user)
    write_frame(job.output.per_turn, per_turn)
    job.note(seeds=job.params.seeds, success_rate=per_user.groupby("seed")["success"].mean().to_dict())
