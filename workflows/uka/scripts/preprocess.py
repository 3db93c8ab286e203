from paperflow.core.job import snakemake_job
from paperflow.uka.embedding import embed

with snakemake_job(snakemake) as job:
    frame = embed(job.params.embedding, job.output[0])
    job.note(encoder=job.params.embedding["kind"], texts=len(frame))
