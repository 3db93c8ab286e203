from paperflow.confu.paper import plain_decoding
from paperflow.core.job import snakemake_job

with snakemake_job(snakemake) as job:
    w, p = job.wildcards, job.params
    rows = job.checkpoint_dir() / "rows.jsonl"  # finished questions; a rerun skips them
    info = plain_decoding(job.input.pretrained, job.input.test, p.target, w.target, p.decoding, job.output[0], rows)
    job.note(**info)
