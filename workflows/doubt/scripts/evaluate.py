from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import evaluate

with snakemake_job(snakemake) as job:
    samples = job.keyed("samples", types=(int,))
    metrics, items = evaluate(job.input.scenes, samples, job.keyed("scores"), job.input.embeddings, job.input.clusterer)
    write_frame(job.output.metrics, metrics)
    write_frame(job.output.per_item, items)
    job.note(seeds=sorted(samples), wrong_rate=float(items["wrong"].mean()))
