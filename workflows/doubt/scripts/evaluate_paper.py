from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import evaluate

with snakemake_job(snakemake) as job:
    labels = job.keyed("labels", types=(str, str, int))
    metrics = evaluate(labels, job.keyed("scores", types=(str, str, int, str)))
    write_frame(job.output[0], metrics)
    job.note(seeds=sorted({s for _, _, s in labels}), rows=len(metrics))
