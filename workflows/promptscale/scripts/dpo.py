from paperflow.core.job import snakemake_job
from paperflow.promptscale.dpo import dpo_job

with snakemake_job(snakemake) as job:
    p = job.params
    summary = dpo_job(
        job.input.policy, job.input.pairs, p.dpo, p.device, p.n_procs, job.output.model, job.output.history
    )
    job.note(seeds=[p.dpo["seed"]], **summary)
