from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import prior_traces

with snakemake_job(snakemake) as job:
    p = job.params
    counts = prior_traces(
        job.input.prior,
        job.input.train,
        p.samples,
        p.evaluation,
        p.device,
        p.dtype,
        p.stop_tokens,
        job.output[0],
        journal=job.checkpoint_dir() / "rows.jsonl",  # finished generate calls; a rerun skips them
    )
    job.note(**counts)
