from paperflow.core.job import snakemake_job
from paperflow.dualreform.stages import train_sft

with snakemake_job(snakemake) as job:
    p, seed = job.params, int(job.wildcards.seed)
    history = train_sft(job.input.table, job.input.passages, p.model, p.sft, seed, job.output.checkpoint)
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[seed], final_loss=float(history["loss"].iloc[-1]))
