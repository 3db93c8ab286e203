from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import sample

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    journal = job.checkpoint_dir() / "rows.jsonl"
    frame = sample(
        job.wildcards.vlm,
        job.input.vlm,
        job.params.spec,
        job.input.questions,
        job.params.sampling,
        seed,
        journal=journal,
    )
    write_frame(job.output[0], frame, {"sampling": dict(job.params.sampling), "vlm": job.wildcards.vlm})
    job.note(seeds=[seed], items=len(frame))
