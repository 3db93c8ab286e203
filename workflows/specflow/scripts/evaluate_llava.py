from paperflow.core.job import snakemake_job
from paperflow.specflow.paper import evaluate

with snakemake_job(snakemake) as job:
    p, w = job.params, job.wildcards
    cfg = {"pretrained": p.pretrained, "specflow": p.specflow, "seeds": p.seeds}
    rows = job.checkpoint_dir() / "rows.jsonl"  # finished questions; a rerun skips them
    info = evaluate(w.method, int(w.budget), job.input.pretrained, job.input.questions, cfg, job.output[0], rows)
    job.note(seeds=list(p.seeds)[:1], seconds=info["seconds"])
