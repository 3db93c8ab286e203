from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.paper import evaluate

with snakemake_job(snakemake) as job:
    p, w = job.params, job.wildcards
    splits = {"dev": job.input.dev, "test": job.input.test}
    cfg = {"pretrained": p.pretrained, "gpus": p.gpus, "max_new_tokens": p.max_new_tokens}
    frame = evaluate(w.task, w.method, p.seeds, job.input.pretrained, job.input.models, splits, cfg)
    write_frame(job.output[0], frame)
    job.note(seeds=list(p.seeds), test_score=float(frame["test_score"].iloc[0]))
