from paperflow.core.io import write_frame
from paperflow.core.job import snakemake_job
from paperflow.dualreform.paper import evaluate

with snakemake_job(snakemake) as job:
    method, seed = job.wildcards.method, int(job.wildcards.seed)
    inputs = dict(job.input.items())
    ckpts = job.keyed("ckpt", types=(int,)) if method not in ("raw", "prompted") else {}
    dense = None
    if job.params.dense:
        dense = {"json": inputs["dense"], "index": inputs["dense_index"], "settings": job.params.dense}
    pretrained = job.params.pretrained if method != "raw" else None
    journal = job.checkpoint_dir() / "rows.jsonl"  # each iteration's row: a rerun evaluates the rest
    frame = evaluate(
        method,
        seed,
        job.input.table,
        job.input.index,
        inputs.get("pretrained"),
        ckpts,
        pretrained,
        job.params.generation,
        dense,
        journal,
        threads=job.threads,
    )
    write_frame(job.output[0], frame, {"method": method, "seed": seed})
    job.note(seed=seed, mrr=frame.groupby("iteration")["mrr"].mean().to_dict())
