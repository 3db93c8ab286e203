from paperflow.confu.paper import evaluate
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    w, p, i = job.wildcards, job.params, job.input
    cfg = {"decoding": p.decoding, "seeds": p.seeds}
    rows = job.checkpoint_dir() / "rows.jsonl"  # finished (question, temperature) rows; a rerun skips them
    info = evaluate(w.method, i.pretrained, i.head, i.test, i.plain, p.target, w.target, cfg, job.output[0], rows)
    job.note(seeds=p.seeds[:1], **info)
