from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.lozo_plus.paper import evaluate

with snakemake_job(snakemake) as job:
    p, w, inputs = job.params, dict(job.wildcards.items()), dict(job.input.items())
    splits = {"dev": job.input.dev, "test": job.input.test}
    cfg = {"pretrained": p.pretrained, "gpus": p.gpus, "max_new_tokens": p.max_new_tokens}
    method = w.get("method", "pretrained")  # no method: the pretrained model before fine-tuning (cpu scale)
    frame = evaluate(w["task"], method, p.seeds, job.input.pretrained, inputs.get("models"), splits, cfg)
    write_frame(job.output[0], frame)
    job.note(seeds=list(p.seeds), test_score=float(frame["test_score"].iloc[0]))
