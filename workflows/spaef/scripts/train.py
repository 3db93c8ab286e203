from paperflow.core.job import snakemake_job
from paperflow.core.keys import unkey
from paperflow.spaef.stages import train_stage

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    histories = unkey(job.output, "history")  # {method: path}
    history, tracking = train_stage(
        job.input.adata,
        job.input.graphs,
        seed,
        unkey(job.output, "denoised"),
        job.params.model,
        job.params.train,
        job.params.run_dir,
        job.params.wandb,
        {"paper": "spaef", "rule": job.rule, "sample": job.wildcards.sample},
        checkpoint_dir=job.checkpoint_dir() if job.params.train["engine"] == "lightning" else None,  # fits resume
    )
    for method, path in histories.items():
        history[history.method == method].to_csv(path, index=False)
    job.note(seeds=[seed], engine=job.params.train["engine"], tracking=tracking)
