from paperflow.core.job import snakemake_job
from paperflow.itpo.paper import evaluate

with snakemake_job(snakemake) as job:
    w = job.wildcards
    inputs, outputs = dict(job.input.items()), dict(job.output.items())
    # the journal of the finished shards, outside the outputs: a rerun runs only the others
    doc = evaluate(w.task, w.method, job.params.cfg, inputs, outputs, checkpoints=str(job.checkpoint_dir()))
    job.note(seeds=[doc["seed"]], reward=doc["reward"])
