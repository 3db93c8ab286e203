from paperflow.core.job import snakemake_job
from paperflow.uka.stages import make_world

with snakemake_job(snakemake) as job:
    p = job.params
    frame = make_world(p.source, {**p.simulation, "seeds": p.seeds}, job.output.world, job.output.users)
    job.note(seeds=p.seeds, users=frame.groupby("split").size().to_dict())
