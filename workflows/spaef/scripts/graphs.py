from paperflow.core.job import snakemake_job
from paperflow.spaef.stages import graphs_stage

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    history, stats = graphs_stage(
        job.input.adata,
        job.input.spots,
        job.input.genes,
        job.input.ggi,
        job.params.graphs,
        [seed],
        [job.output.graphs],
        job.params.run_dir,
        job.params.wandb,
        {"paper": "spaef", "rule": job.rule, "sample": job.wildcards.sample},
        engine=job.params.engine,
        checkpoint_dir=job.checkpoint_dir() if job.params.engine == "lightning" else None,  # the AE fits resume
    )
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[seed], engine=job.params.engine, graphs=stats)
