from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import embed

with snakemake_job(snakemake) as job:
    frame = embed(job.input.encoder, job.params.spec, job.input.questions, job.input.samples)
    write_frame(job.output[0], frame)
    job.note(seeds=[int(job.wildcards.seed)], distinct_answers=len(frame))
