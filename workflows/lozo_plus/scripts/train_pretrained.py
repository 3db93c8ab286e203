from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.paper import train

with snakemake_job(snakemake) as job:
    p, w = job.params, job.wildcards
    cfg = {"pretrained": p.pretrained, "run": p.run, "zo": p.zo, "lr": p.lr, "ft": p.ft, "gpus": p.gpus}
    # paper scale: the job's checkpoint folder (a rerun resumes the cut run); cpu scale's short runs need none
    folder = job.checkpoint_dir() if job.rule in ("lozo_plus_train", "lozo_plus_train_node") else None
    out = dict(job.output.items())
    summary = train(w.task, w.method, p.seeds, job.input.pretrained, job.input.train, cfg, out, checkpoint_dir=folder)
    job.note(seeds=list(p.seeds), **{k: summary[k] for k in ("train_loss", "forwards", "peak_memory_bytes", "gpus")})
