from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.decfus.evaluation import evaluate

with snakemake_job(snakemake) as job:
    train = job.params.train
    curves, clients, ckpts = (job.keyed(name, types=(str, str)) for name in ("curves", "clients", "ckpt"))
    runs = [
        {"method": method, "curves": path, "clients": clients[(method, group)], "checkpoint": ckpts[(method, group)]}
        for (method, group), path in curves.items()
    ]
    frame = evaluate(
        runs,
        job.input.test,
        job.params.tail,
        train["backend"],
        train["eval_batch_size"],
        train["device"],
        journal=job.checkpoint_dir() / "runs.jsonl",  # evaluated runs; a rerun evaluates only the rest
    )
    write_frame(job.output[0], frame, {"dataset": job.wildcards.dataset, "partition": job.wildcards.partition})
    job.note(seeds=job.params.seeds)
