from paperflow.core.job import snakemake_job
from paperflow.safer.evaluation import run_evaluation

with snakemake_job(snakemake) as job:
    info = run_evaluation(
        job.wildcards.method,
        job.input.tasks,
        job.input.states,
        dict(job.params.method),
        job.params.tpr,
        job.output.acc,
        job.output.open,
        journal=job.checkpoint_dir() / "seeds.jsonl",  # evaluated seeds; a rerun evaluates only the rest
    )
    job.note(**info)
