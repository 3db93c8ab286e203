from paperflow.confu.paper import regenerate
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    w, p = job.wildcards, job.params
    rows = job.checkpoint_dir() / "rows.jsonl"  # finished batches; a rerun skips them
    n = regenerate(
        job.input.pretrained, job.input.train, int(w.shard), p.target, w.target, p.regenerate, job.output[0], rows
    )
    job.note(sequences=n)
