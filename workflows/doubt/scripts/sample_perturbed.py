from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.vl_uncertainty import radii, sample, temperature

with snakemake_job(snakemake) as job:
    seed, vlm, bench = int(job.wildcards.seed), job.wildcards.vlm, job.wildcards.bench
    vlu = job.params.vlu
    journal = job.checkpoint_dir() / "rows.jsonl"
    frame = sample(
        vlm, bench, job.input.vlm, job.params.spec, job.input.questions, job.input.prompts, vlu, seed, journal=journal
    )
    meta = {"vlm": vlm, "radii": radii(vlu, bench), "temperature": temperature(vlu, vlm, bench)}
    write_frame(job.output[0], frame, meta)
    job.note(seeds=[seed], items=len(frame))
