from paperflow.core.job import snakemake_job
from paperflow.promptscale.stages import train_direct

with snakemake_job(snakemake) as job:
    seed = int(job.wildcards.seed)
    history = train_direct(
        job.input.problems, job.input.triples, job.input.vocabulary, job.params.settings, seed, job.output[0]
    )
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[seed], final_loss=float(history["loss"].iloc[-1]))
