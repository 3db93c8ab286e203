from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import score

with snakemake_job(snakemake) as job:
    samples = job.keyed("samples", types=(int,))
    frame = score(job.wildcards.method, samples, job.input.embeddings, job.input.clusterer, job.params.scoring)
    write_frame(job.output[0], frame, {"scoring": dict(job.params.scoring)})
    job.note(seeds=sorted(samples), rows=len(frame))
