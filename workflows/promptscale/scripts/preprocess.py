from paperflow.core.job import snakemake_job
from paperflow.promptscale.prepare import preprocess

with snakemake_job(snakemake) as job:
    frame = preprocess(job.input[0], job.params.annotator, job.output.triples, job.output.vocabulary)
    job.note(seeds=[job.params.annotator["seed"]], annotation_accuracy=float(frame["accuracy"].mean()))
