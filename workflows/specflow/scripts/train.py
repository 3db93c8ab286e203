from paperflow.core.job import snakemake_job
from paperflow.specflow.stages import train_seeds

with snakemake_job(snakemake) as job:
    p = job.params
    seed = int(job.wildcards.seed)
    cfg = {"data": p.data, "encoder": p.encoder, "reader": p.reader, "train": p.train, "ratios": p.ratios}
    history = train_seeds(job.input[0], cfg, [seed], {seed: job.output.checkpoint}, {seed: job.output.tokens})
    history.to_csv(job.output.history, index=False)
    job.note(seeds=[seed], full_accuracy=float(history["test_accuracy_full"].iloc[-1]))
