from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import embed

with snakemake_job(snakemake) as job:
    samples = job.keyed("samples", types=(int,))
    frame = embed(list(samples.values()), job.params.embedding["batch_size"])
    write_frame(job.output[0], frame)
    job.note(seeds=sorted(samples), distinct_answers=len(frame))
