from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.eapo.paper import evaluate

with snakemake_job(snakemake) as job:
    p = job.params
    rows = job.checkpoint_dir() / "rows.jsonl"  # finished generate calls; a rerun skips them
    frame = evaluate(
        job.input.model, job.keyed("bench"), p.ks, p.evaluation, p.device, p.dtype, p.stop_tokens, journal=rows
    )
    write_frame(job.output[0], frame, {"method": job.wildcards.method, "seed": int(job.wildcards.seed)})
    job.note(seeds=[int(job.wildcards.seed)], problems=len(frame))
