from paperflow.core.job import snakemake_job
from paperflow.dualreform.paper import train

with snakemake_job(snakemake) as job:
    p, w = job.params, job.wildcards
    method = dict(w.items()).get("method") or p.method
    cfg = {k: p[k] for k in ("pretrained", "lora", "trl_sft", "trl_dpo", "iterations", "generation")}
    outputs = {"checkpoints": list(job.output.checkpoints), "history": job.output.history, "refs": job.output.refs}
    history = train(
        method,
        int(w.seed),
        job.input.table,
        job.input.index,
        job.input.pretrained,
        cfg,
        outputs,
        checkpoint=job.checkpoint_dir(),
        threads=job.threads,
    )
    job.note(method=method, seed=int(w.seed), steps=len(history))
