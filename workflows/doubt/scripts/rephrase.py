from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.vl_uncertainty import rephrase

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    journal = job.checkpoint_dir() / "rows.jsonl"
    frame = rephrase(job.input.judge, job.params.spec, job.params.vlu, job.input.questions, seed, journal=journal)
    write_frame(
        job.output[0], frame, {"llm": job.params.spec["hub"], "temperatures": job.params.vlu["rephrase_temperatures"]}
    )
    job.note(seeds=[seed], items=len(frame))
