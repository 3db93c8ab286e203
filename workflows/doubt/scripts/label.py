from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.doubt.paper import label_multi_choice

with snakemake_job(snakemake) as job:
    frame = label_multi_choice(job.input.raw, job.input.samples)
    write_frame(job.output[0], frame)
    job.note(seeds=[int(job.wildcards.seed)], wrong_rate_official=float(1 - frame["correct_official"].mean()))
