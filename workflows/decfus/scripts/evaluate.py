from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.decfus.evaluation import evaluate

with snakemake_job(snakemake) as job:
    train = job.params.train
    methods = [m for m in job.params.methods for _ in job.params.groups]  # the rule's input order
    runs = [
        {"method": m, "curves": c, "clients": k, "checkpoint": p}
        for m, c, k, p in zip(methods, job.input.curves, job.input.clients, job.input.checkpoints)
    ]
    frame = evaluate(runs, job.input.test, job.params.tail, train["backend"], train["eval_batch_size"], train["device"])
    write_frame(job.output[0], frame, {"dataset": job.wildcards.dataset, "partition": job.wildcards.partition})
    job.note(seeds=job.params.seeds)
