from paperflow.core.job import snakemake_job
from paperflow.doubt.stages import train

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    history = train(
        job.input.scenes, job.params.model, job.params.train, seed, job.params.temperature, job.output.checkpoint
    )
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[seed], final_loss=float(history["loss"].tail(20).mean()))
