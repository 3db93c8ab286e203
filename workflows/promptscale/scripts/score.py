from paperflow.core.job import snakemake_job
from paperflow.promptscale.llm_text import model_folder
from paperflow.promptscale.paper import score_estep

with snakemake_job(snakemake) as job:
    summary = score_estep(
        int(job.wildcards.m),
        model_folder(job.input.p),
        model_folder(job.input.q),
        job.input.train,
        job.input.heldout,
        job.input.samples,
        job.params.em,
        job.params.model,
        job.params.em["score_batch_size"],
        job.output.kept,
        job.output.bound,
        journal=job.checkpoint_dir() / "rows.jsonl",  # scored batches; a rerun scores only the rest
    )
    job.note(**summary)
