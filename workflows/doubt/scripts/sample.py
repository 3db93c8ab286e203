from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import sample

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    frame = sample(job.input.scenes, job.input.checkpoint, job.params.sampling, seed)
    write_frame(job.output[0], frame, {"sampling": dict(job.params.sampling)})
    job.note(seeds=[seed], items=len(frame))
