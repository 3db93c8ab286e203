from paperflow.core.job import snakemake_job
from paperflow.promptscale.sft_arm import sft_job

with snakemake_job(snakemake) as job:
    p = job.params
    summary = sft_job(
        job.input.start, job.input.traces, p.settings, p.device, p.n_procs, job.output.model, job.output.history
    )
    job.note(seeds=[p.settings["seed"]], **summary)
