from paperflow.core.job import snakemake_job
from paperflow.spaef.stages import train_stage

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    history, tracking = train_stage(
        job.input.adata, [job.input.graphs], job.wildcards.method, [seed], job.params.model, job.params.train,
        [job.output.denoised], job.params.run_dir, job.params.wandb,
        {"paper": "spaef", "rule": job.rule, "sample": job.wildcards.sample, "method": job.wildcards.method},
    )
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[seed], tracking=tracking)
