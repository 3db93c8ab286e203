from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.stages import train

with snakemake_job(snakemake) as job:
    p = job.params
    cfg = {"run": p.run, "zo": p.zo, "lr": p.lr, "ft": p.ft}
    finals = train(job.wildcards.method, p.seeds, job.input.source, job.input.train, cfg, dict(job.output.items()))
    job.note(seeds=list(p.seeds), final_train_loss=finals)
