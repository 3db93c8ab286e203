from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import judge

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    journal = job.checkpoint_dir() / "rows.jsonl"
    frame = judge(job.input.judge, job.params.spec, job.input.raw, job.input.samples, seed, journal=journal)
    write_frame(job.output[0], frame)
    job.note(seeds=[seed], wrong_rate_official=float(1 - frame["correct_official"].mean()))
