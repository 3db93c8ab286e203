from paperflow.core.job import snakemake_job
from paperflow.safer.evaluation import run_evaluation

with snakemake_job(snakemake) as job:
    cfg = {k: job.params[k] for k in ("backbone", "expert", "safer", "tpp", "evaluation")}
    info = run_evaluation(job.wildcards.method, job.input.tasks, job.input.states, cfg, job.output.acc, job.output.open)
    job.note(**info)
