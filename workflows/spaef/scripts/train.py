from paperflow.core.job import snakemake_job
from paperflow.spaef.stages import train_stage

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    methods = job.params.methods  # outputs are in this order (see the rule)
    history, tracking = train_stage(
        job.input.adata,
        job.input.graphs,
        seed,
        methods,
        job.params.model,
        job.params.train,
        job.output.denoised,
        job.params.run_dir,
        job.params.wandb,
        {"paper": "spaef", "rule": job.rule, "sample": job.wildcards.sample},
    )
    for method, path in zip(methods, job.output.history, strict=True):
        history[history.method == method].to_csv(path, index=False)
    job.note(seeds=[seed], engine=job.params.train["engine"], tracking=tracking)
